"""What crosses between a frontend worker process and the core process.

Every message is a NamedTuple registered in `KINDS` (oceanus/ipc: framed with `marshal`, typed by
its last field, read by name). A decoded inference request travels as its fields; its tensors'
bytes travel inline when small and through the sender's shared-memory ring (oceanus/ipc/rings.py,
one per direction per worker) when at least `RING_BYTES`. Anything the worker cannot decode to
the very same request the core would have decoded (shared memory regions, traced requests,
malformed bodies, datatypes it would have to convert) is not decoded in the worker at all: the
worker forwards the raw protocol request and the core answers it with the ordinary in-process
frontend, so every answer is the in-process one.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from oceanus.core import datatypes
from oceanus.core.errors import ErrorCode, InferenceServerError
from oceanus.core.tensor_bytes import bytes_elements
from oceanus.core.types import InferRequest, InferResponse, RequestedOutput, Tensor
from oceanus.ipc.channel import MessageKinds
from oceanus.ipc.rings import Location, RingReader, RingWriter
from oceanus.ipc.tensors import ALIGN

# ---- worker -> core ------------------------------------------------------------------------------


class Hello(NamedTuple):
    """The worker listens (or could not: `error`)."""

    worker: int
    pid: int
    error: str
    kind: int = 1


class Infer(NamedTuple):
    """A decoded request: `request` is encode_request's fields, `block` its ring block."""

    id: int
    caller: str
    request: tuple[Any, ...]
    block: Location | None
    checked: int = 0  # the serial of the version it passed validation for (mirror.py); 0: none
    cache_key: bytes = b""  # its response cache key, when that version caches (mirror.py)
    kind: int = 2


class Cancel(NamedTuple):
    """The client left: the core drops the request if it is still queued."""

    id: int
    kind: int = 3


class Http(NamedTuple):
    """A whole HTTP request for the core's in-process frontend."""

    id: int
    method: str
    path: str
    headers: list[tuple[bytes, bytes]]
    body: bytes
    too_large: bool
    begin_ns: int
    end_ns: int
    kind: int = 4


class Grpc(NamedTuple):
    """A unary RPC answered in-process."""

    id: int
    method: str
    data: bytes
    metadata: list[tuple[str, str]]
    kind: int = 5


class StreamOpen(NamedTuple):
    """A ModelStreamInfer call began."""

    id: int
    metadata: list[tuple[str, str]]
    kind: int = 6


class StreamIn(NamedTuple):
    id: int
    data: bytes
    kind: int = 7


class StreamEnd(NamedTuple):
    """The client sent its last message."""

    id: int
    kind: int = 8


class Generate(NamedTuple):
    """A language model's typed request, templated and tokenized in the worker (for a model
    whose engine published GenerationInfo): `sampling` is SamplingParams' fields in order."""

    id: int
    model: str
    request_id: str
    prompt_ids: list[int]
    sampling: tuple[Any, ...]
    stream: bool
    logprobs: bool
    kind: int = 9


# ---- core -> worker ------------------------------------------------------------------------------


class Settings(NamedTuple):
    """The pickled Settings: the first message a worker gets."""

    blob: bytes
    kind: int = 20


class State(NamedTuple):
    """Server state the workers mirror (trace sampling on/off, log settings)."""

    values: dict[str, Any]
    kind: int = 21


class InferOk(NamedTuple):
    id: int
    response: tuple[Any, ...]
    block: Location | None
    kind: int = 22


class InferError(NamedTuple):
    id: int
    code: str
    message: str
    kind: int = 23


class HttpAnswer(NamedTuple):
    id: int
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes | memoryview
    kind: int = 24


class HttpHead(NamedTuple):
    """A streamed response's head."""

    id: int
    status: int
    headers: list[tuple[bytes, bytes]]
    kind: int = 25


class HttpChunk(NamedTuple):
    id: int
    data: bytes
    kind: int = 26


class HttpDone(NamedTuple):
    """The streamed response ended."""

    id: int
    kind: int = 27


class GrpcOk(NamedTuple):
    id: int
    data: bytes
    kind: int = 28


class GrpcError(NamedTuple):
    id: int
    code: int
    details: str
    kind: int = 29


class StreamOut(NamedTuple):
    id: int
    data: bytes
    kind: int = 30


class StreamDone(NamedTuple):
    """A stream ended: status code value (0: OK) and details."""

    id: int
    code: int
    details: str
    kind: int = 31


class Generated(NamedTuple):
    """One GenerationOutput of a Generate call (its fields in order)."""

    id: int
    output: tuple[Any, ...]
    kind: int = 33


class GenerateDone(NamedTuple):
    """The Generate call's responses ended (an error ends it as InferError)."""

    id: int
    kind: int = 34


class Drain(NamedTuple):
    """Stop accepting connections, finish what is in flight, exit."""

    kind: int = 32


KINDS = MessageKinds(
    [
        Hello,
        Infer,
        Cancel,
        Http,
        Grpc,
        StreamOpen,
        StreamIn,
        StreamEnd,
        Settings,
        State,
        InferOk,
        InferError,
        HttpAnswer,
        HttpHead,
        HttpChunk,
        HttpDone,
        GrpcOk,
        GrpcError,
        StreamOut,
        StreamDone,
        Drain,
        Generate,
        Generated,
        GenerateDone,
    ]
)

# A tensor of at least this many bytes crosses through the sender's ring (one copy in, one out);
# a smaller one inline in the message (tobytes, then marshal's copies): placing and releasing a
# ring block costs a few µs of Python, more than copying a few KiB twice.
RING_BYTES = 64 * 1024
# Each datatype's numpy dtype by name (BYTES: object), looked up per tensor on both ends.
_DTYPES = {name: datatype.dtype for name, datatype in datatypes.BY_NAME.items()}


class NeedsCore(Exception):
    """Raised while a worker decodes a request it must forward to the core undecoded."""


# ---- tensor bytes --------------------------------------------------------------------------------
# A tensor's fields: (name, datatype, shape, payload, extra). The payload is the bytes themselves,
# or (offset, size) in the message's ring block; between encoding and `place` a big tensor's
# payload is its raw uint8 array (encoding may run on a thread, placing must happen in send
# order on the loop: a ring's blocks are released in the order they were received).


def _payload(raw: np.ndarray) -> Any:
    return raw.tobytes() if raw.nbytes < RING_BYTES else raw


def place(
    tensors: list[tuple[Any, ...]], writer: RingWriter | None
) -> tuple[list[tuple[Any, ...]], Location | None]:
    """The tensors with their big payloads placed in one block of `writer`'s ring (inline when
    there is no ring), and the block's location."""
    big = [i for i, tensor in enumerate(tensors) if isinstance(tensor[3], np.ndarray)]
    if not big:
        return tensors, None
    placed = list(tensors)
    if writer is None:
        for i in big:
            placed[i] = (*tensors[i][:3], tensors[i][3].data, tensors[i][4])
        return placed, None
    total = sum(-(-tensors[i][3].nbytes // ALIGN) * ALIGN for i in big)
    loc, view, mapping = writer.place(total)
    offset = 0
    for i in big:
        raw = tensors[i][3]
        view[offset : offset + raw.nbytes] = raw
        placed[i] = (*tensors[i][:3], (offset, raw.nbytes), tensors[i][4])
        offset += -(-raw.nbytes // ALIGN) * ALIGN
    if mapping is not None:
        del view
        mapping.close()
    return placed, loc


class Block:
    """The ring block of one received message, open until `close` (its bytes are copied out:
    what the core keeps, a cached response say, must not view a ring the sender reuses)."""

    def __init__(self, reader: RingReader | None, loc: Location | None) -> None:
        self._reader = reader
        self.data: np.ndarray | None = None
        self._token: list[Any] | None = None
        if loc is not None:
            if reader is None:
                raise ValueError("a ring block without a ring")
            self.data, self._token = reader.open(loc)

    def bytes_of(self, payload: Any) -> Any:
        if isinstance(payload, tuple):
            assert self.data is not None
            offset, size = payload
            return self.data[offset : offset + size].tobytes()
        return payload

    def close(self) -> None:
        if self._reader is not None and self._token is not None:
            self._reader.release(self._token)
            self._token = None


# ---- requests ------------------------------------------------------------------------------------


def _tensor_fields(tensor: Tensor) -> tuple[Any, ...]:
    data = tensor.data
    datatype = datatypes.BY_NAME.get(tensor.datatype)
    if datatype is None or not isinstance(data, np.ndarray):
        raise NeedsCore
    if datatype.is_bytes:
        if data.dtype != np.dtype(object) or not all(isinstance(v, bytes) for v in data.flat):
            raise NeedsCore  # str elements, say: the core would see them as they are
        raw = np.frombuffer(datatypes.serialize_bytes(data), dtype=np.uint8)
    elif data.dtype != datatype.dtype:
        raise NeedsCore  # the core's validation would see this dtype: let it
    else:
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    return (tensor.name, tensor.datatype, tensor.shape, _payload(raw), tensor.parameters or None)


def encode_request(request: InferRequest) -> tuple[Any, ...]:
    """The fields of a decoded request (raises NeedsCore for what only the core can carry);
    `place` its inputs (fields[3]) before sending."""
    if request.shm_regions or request.trace is not None:
        raise NeedsCore
    outputs = None
    if request.outputs is not None:
        outputs = []
        for output in request.outputs:
            if output.shm is not None:
                raise NeedsCore
            outputs.append((output.name, output.parameters or None))
    return (
        request.model_name,
        request.model_version,
        request.id,
        [_tensor_fields(tensor) for tensor in request.inputs],
        outputs,
        request.parameters or None,
        request.received_ns,
    )


def place_request(
    fields: tuple[Any, ...], writer: RingWriter | None
) -> tuple[tuple[Any, ...], Location | None]:
    inputs, loc = place(fields[3], writer)
    return (*fields[:3], inputs, *fields[4:]), loc


def decode_request(fields: tuple[Any, ...], block: Block | None = None) -> InferRequest:
    name, version, request_id, inputs, outputs, parameters, received_ns = fields
    tensors = []
    for tensor_name, datatype_name, shape, payload, tensor_parameters in inputs:
        if block is not None:
            payload = block.bytes_of(payload)
        if datatype_name == "BYTES":
            data = bytes_elements(tensor_name, payload)
        else:
            data = np.frombuffer(payload, dtype=_DTYPES[datatype_name])
        tensors.append(Tensor(tensor_name, datatype_name, shape, data, tensor_parameters or {}))
    requested = None
    if outputs is not None:
        requested = [RequestedOutput(n, p or {}) for n, p in outputs]
    # Positional: the dataclass's field order (model_name, model_version, id, inputs, outputs,
    # parameters, received_ns), a few keyword look-ups less per request.
    return InferRequest(
        name, version, request_id, tensors, requested, parameters or {}, received_ns
    )


# ---- responses -----------------------------------------------------------------------------------


def encode_response(
    response: InferResponse, writer: RingWriter | None = None
) -> tuple[tuple[Any, ...], Location | None]:
    """The response's fields and the ring block of its big outputs."""
    outputs = []
    big = False
    for tensor in response.outputs:
        data = tensor.data
        datatype = tensor.datatype
        if datatype == "BYTES":
            raw = np.frombuffer(datatypes.serialize_bytes(data), dtype=np.uint8)
            dtype = ""
        elif data.dtype == _DTYPES[datatype] and data.nbytes < RING_BYTES:
            # The usual output: its own dtype, small. One copy (tobytes reads C order whatever
            # the array's layout), not the four calls of the general path below.
            outputs.append((tensor.name, datatype, data.shape, data.tobytes(), ""))
            continue
        else:
            raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
            # Usually the datatype's own dtype; a Python model may answer in another one.
            dtype = "" if data.dtype == _DTYPES[datatype] else data.dtype.str
        payload = _payload(raw)
        big = big or not isinstance(payload, bytes)
        outputs.append((tensor.name, datatype, data.shape, payload, dtype))
    placed, loc = place(outputs, writer) if big else (outputs, None)
    fields = (
        response.model_name,
        response.model_version,
        response.id,
        placed,
        response.parameters or None,
    )
    return fields, loc


def decode_response(
    fields: tuple[Any, ...], request: InferRequest, block: Block | None = None
) -> InferResponse:
    """The response to `request` (which names the outputs the client asked for)."""
    name, version, response_id, outputs, parameters = fields
    tensors = []
    for tensor_name, datatype_name, shape, payload, dtype in outputs:
        if block is not None:
            payload = block.bytes_of(payload)
        if datatype_name == "BYTES":
            data = bytes_elements(tensor_name, payload).reshape(shape)
        else:
            numpy_dtype = np.dtype(dtype) if dtype else datatypes.BY_NAME[datatype_name].dtype
            data = np.frombuffer(payload, dtype=numpy_dtype).reshape(shape)
        tensors.append(Tensor(tensor_name, datatype_name, tuple(shape), data))
    requested = None
    if request.outputs is not None:
        requested = {output.name: output for output in request.outputs}
    return InferResponse(
        model_name=name,
        model_version=version,
        id=response_id,
        outputs=tensors,
        requested=requested,
        parameters=parameters or {},
    )


def error_fields(exc: BaseException) -> tuple[str, str]:
    """(code, message) of a failure, as the in-process frontends would report it."""
    if isinstance(exc, InferenceServerError):
        return exc.code.value, exc.message
    return ErrorCode.INTERNAL.value, f"internal error: {type(exc).__name__}: {exc}"


def error_of(code: str, message: str) -> InferenceServerError:
    return InferenceServerError(ErrorCode(code), message)
