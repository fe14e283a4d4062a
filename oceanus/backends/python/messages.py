"""The messages between the server and a Python stub process, one typed structure per kind.

Each is a NamedTuple whose last field, `kind`, is its number on the wire (senders never write
it). On the wire a message is its plain tuple framed with `marshal` (oceanus.ipc.channel); the
reader rebuilds the NamedTuple from the number at the end with one `tuple.__new__`, so the typed
messages cost what the old tagged tuples cost (bench/investigations/ipc_messages.py). Tensor
data never travels
in a message: `location` names a block of a shared-memory ring (or a one-off file) and `descs`
describe the tensors in it (oceanus.ipc.tensors.TensorDesc). Nested values stay plain tuples,
typed by the aliases here.

A stub's life on the wire: the server sends Init (or Autocomplete); the stub answers Ready,
having sent Log, Call and MetricUpdate meanwhile from initialize(). Then each batch is one Exec
answered by one Result; a response sender's responses are Responses; BLS requests (Bls),
cancellation queries (Query) and calls (Call) may come at any time, each answered by its own
message. Finalize ends it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeAlias

from oceanus.ipc.channel import MessageKinds
from oceanus.ipc.rings import Location as BlockLocation
from oceanus.ipc.tensors import TensorDesc

if TYPE_CHECKING:
    from typing_extensions import TypeIs

# Where a message's tensors are (oceanus.ipc.rings.Location); None when it has no bytes.
Location: TypeAlias = "BlockLocation | None"
# A response's outputs and parameters (JSON), or its error (core ErrorCode name, message).
OkPayload: TypeAlias = "tuple[Literal['ok'], list[TensorDesc], str]"
ErrorPayload: TypeAlias = "tuple[Literal['err'], str, str]"
Payload: TypeAlias = "OkPayload | ErrorPayload"
# One request of an Exec: (key, request id, correlation id, flags, timeout, parameters JSON,
# requested output names, input descs); `key` names the request in later messages.
RequestEntry: TypeAlias = "tuple[int, str, int | str, int, int, str, list[str], list[TensorDesc]]"


def ok_payload(descs: list[TensorDesc], parameters: str) -> OkPayload:
    return ("ok", descs, parameters)


def error_payload(code: str, message: str) -> ErrorPayload:
    return ("err", code, message)


def is_error(payload: Payload) -> TypeIs[ErrorPayload]:
    return payload[0] == "err"


# ---- server -> stub ----------------------------------------------------------------------------


class Init(NamedTuple):
    """Start the model: import model.py, map the rings, call initialize()."""

    model_path: str
    args: dict[str, str]  # Triton's `args` for initialize()
    decoupled: bool
    s2w: str  # the server -> stub ring file
    w2s: str  # the stub -> server ring file
    capacity: int  # of each ring, at start
    spill_prefix: str  # one-off files for messages too big for the ring, and its new segments
    growth: int  # the step by which the stub's ring grows (0: never)
    kind: int = 1


class Autocomplete(NamedTuple):
    """Call the model's auto_complete_config on a config (a one-off stub)."""

    model_path: str
    config_json: str
    kind: int = 2


class Exec(NamedTuple):
    """Execute one batch. Each request: (key, request id, correlation id, flags, timeout,
    parameters JSON, requested output names, input descs)."""

    batch_id: int
    location: Location
    requests: list[RequestEntry]
    kind: int = 3


class BlsResponse(NamedTuple):
    """A response (payload) or the end (final) of a BLS request the model sent."""

    bls_id: int
    location: Location
    payload: Payload | None
    final: bool
    kind: int = 4


class QueryAnswer(NamedTuple):
    query_id: int
    cancelled: bool
    kind: int = 5


class CallAnswer(NamedTuple):
    call_id: int
    error: str | None
    result: Any
    kind: int = 6


class IsReady(NamedTuple):
    """Call the model's is_ready()."""

    check_id: int
    kind: int = 7


class Finalize(NamedTuple):
    """Call finalize() and exit."""

    kind: int = 8


# ---- stub -> server ----------------------------------------------------------------------------


class Ready(NamedTuple):
    """initialize() returned (error None) or failed; for Autocomplete, `result` is the config
    JSON, otherwise whether the model has an is_ready()."""

    error: str | None
    result: Any
    kind: int = 9


class Result(NamedTuple):
    """A batch's responses, one payload per request (None: it answers through its response
    sender), or the error of the whole batch."""

    batch_id: int
    location: Location
    payloads: list[Payload | None] | None
    error: str | None
    kind: int = 10


class Response(NamedTuple):
    """One response sent through a response sender (payload None: the final flag alone)."""

    key: int
    location: Location
    payload: Payload | None
    final: bool
    kind: int = 11


class Log(NamedTuple):
    level: str
    text: str
    kind: int = 12


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
    descs: list[TensorDesc]
    kind: int = 13


class Query(NamedTuple):
    """Is the request `key` cancelled?"""

    query_id: int
    key: int
    kind: int = 14


class Call(NamedTuple):
    """A pb_utils call the server answers (model readiness and control, custom metrics)."""

    call_id: int
    operation: str
    args: Any
    kind: int = 15


class MetricUpdate(NamedTuple):
    """A custom metric update or deletion (no answer)."""

    metric_id: int
    operation: str
    value: float
    kind: int = 16


class IsReadyAnswer(NamedTuple):
    check_id: int
    ready: bool
    error: str | None
    kind: int = 17


class Finalized(NamedTuple):
    """finalize() returned."""

    kind: int = 18


Message: TypeAlias = (
    "Init | Autocomplete | Exec | BlsResponse | QueryAnswer | CallAnswer | IsReady | Finalize"
    " | Ready | Result | Response | Log | Bls | Query | Call | MetricUpdate | IsReadyAnswer"
    " | Finalized"
)

KINDS = MessageKinds(
    (
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
)
