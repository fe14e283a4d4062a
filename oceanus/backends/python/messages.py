"""The messages between the server and a Python worker process, one typed structure per kind.

Each is a NamedTuple; on the wire it is `(kind number, *fields)` framed with `marshal`
(transport.py), so the structures cost what the plain tuples cost. Tensor data never travels in
a message: `location` names a block of a shared-memory ring (or a one-off file) and `descs`
describe the tensors in it (transport.TensorDesc).
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypeAlias

# (location kind "r": data offset, end position) or ("f": path, size); None when no bytes.
Location: TypeAlias = "tuple[Any, ...] | None"
# A response's outputs and parameters (JSON), or its error (core ErrorCode name, message).
OkPayload: TypeAlias = "tuple[str, Any, str]"  # ("ok", tensor descs, parameters JSON)
ErrorPayload: TypeAlias = "tuple[str, Any, str]"  # ("err", code name, message)
Payload: TypeAlias = "OkPayload | ErrorPayload"


def ok_payload(descs: Any, parameters: str) -> OkPayload:
    return ("ok", descs, parameters)


def error_payload(code: str, message: str) -> ErrorPayload:
    return ("err", code, message)


def is_error(payload: Payload) -> bool:
    return payload[0] == "err"


# ---- server -> worker ----------------------------------------------------------------------------


class Init(NamedTuple):
    """Start the model: import model.py, map the rings, call initialize()."""

    model_path: str
    args: dict[str, str]  # Triton's `args` for initialize()
    decoupled: bool
    s2w: str  # the server -> worker ring file
    w2s: str  # the worker -> server ring file
    capacity: int
    spill_prefix: str  # one-off files for messages too big for the ring


class Autocomplete(NamedTuple):
    """Call the model's auto_complete_config on a config (a one-off worker)."""

    model_path: str
    config_json: str


class Exec(NamedTuple):
    """Execute one batch. Each request: (key, request id, correlation id, flags, timeout,
    parameters JSON, requested output names, input descs)."""

    batch_id: int
    location: Location
    requests: list[tuple[Any, ...]]


class BlsResponse(NamedTuple):
    """A response (payload) or the end (final) of a BLS request the model sent."""

    bls_id: int
    location: Location
    payload: Payload | None
    final: bool


class QueryAnswer(NamedTuple):
    query_id: int
    cancelled: bool


class CallAnswer(NamedTuple):
    call_id: int
    error: str | None
    result: Any


class IsReady(NamedTuple):
    """Call the model's is_ready()."""

    check_id: int


class Finalize(NamedTuple):
    """Call finalize() and exit."""


# ---- worker -> server ----------------------------------------------------------------------------


class Ready(NamedTuple):
    """initialize() returned (error None) or failed; for Autocomplete, `result` is the config
    JSON, otherwise whether the model has an is_ready()."""

    error: str | None
    result: Any


class Result(NamedTuple):
    """A batch's responses, one payload per request (None: it answers through its response
    sender), or the error of the whole batch."""

    batch_id: int
    location: Location
    payloads: list[Payload | None] | None
    error: str | None


class Response(NamedTuple):
    """One response sent through a response sender (payload None: the final flag alone)."""

    key: int
    location: Location
    payload: Payload | None
    final: bool


class Log(NamedTuple):
    level: str
    text: str


class Bls(NamedTuple):
    """An inference request the model sends to any loaded model."""

    bls_id: int
    model_name: str
    model_version: int
    request_id: str
    correlation_id: int | str
    flags: int
    timeout: int
    parameters_json: str
    output_names: list[str]
    decoupled: bool
    location: Location
    descs: list[Any]


class Query(NamedTuple):
    """Is the request `key` cancelled?"""

    query_id: int
    key: int


class Call(NamedTuple):
    """A pb_utils call the server answers (model readiness and control, custom metrics)."""

    call_id: int
    operation: str
    args: Any


class MetricUpdate(NamedTuple):
    """A custom metric update or deletion (no answer)."""

    metric_id: int
    operation: str
    value: float


class IsReadyAnswer(NamedTuple):
    check_id: int
    ready: bool
    error: str | None


class Finalized(NamedTuple):
    """finalize() returned."""


Message: TypeAlias = (
    "Init | Autocomplete | Exec | BlsResponse | QueryAnswer | CallAnswer | IsReady | Finalize"
    " | Ready | Result | Response | Log | Bls | Query | Call | MetricUpdate | IsReadyAnswer"
    " | Finalized"
)

_TYPES: tuple[type[Any], ...] = (
    Init,
    Autocomplete,
    Exec,
    BlsResponse,
    QueryAnswer,
    CallAnswer,
    IsReady,
    Finalize,
    Ready,
    Result,
    Response,
    Log,
    Bls,
    Query,
    Call,
    MetricUpdate,
    IsReadyAnswer,
    Finalized,
)
_KINDS: dict[type[Any], int] = {kind: number for number, kind in enumerate(_TYPES)}


def encode(message: Message) -> tuple[Any, ...]:
    """The plain tuple marshal writes."""
    return (_KINDS[type(message)], *message)


def decode(data: tuple[Any, ...]) -> Message:
    message: Message = _TYPES[data[0]]._make(data[1:])
    return message
