"""What crosses between a frontend worker process and the core process.

Every message is a tuple of plain values whose first element is its kind; `channel.py` frames
them with `marshal` (both ends run the same interpreter). A decoded inference request travels as
its fields and its tensors' bytes; the core rebuilds an `InferRequest` whose arrays view those
bytes in place. Anything the worker cannot decode to the very same request the core would have
decoded (shared memory regions, traced requests, malformed bodies, datatypes it would have to
convert) is not decoded in the worker at all: the worker forwards the raw protocol request and
the core answers it with the ordinary in-process frontend, so every answer is the in-process one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from oceanus.core import datatypes
from oceanus.core.errors import ErrorCode, InferenceServerError
from oceanus.core.tensor_bytes import bytes_elements
from oceanus.core.types import InferRequest, InferResponse, RequestedOutput, Tensor

# ---- kinds ---------------------------------------------------------------------------------------
# worker -> core
HELLO = 1  # (HELLO, worker index, pid)
INFER = 2  # (INFER, id, caller, request fields): a decoded request
CANCEL = 3  # (CANCEL, id): the client left; the core drops the request if it is still queued
HTTP = 4  # (HTTP, id, method, path, headers, body, too_large, begin_ns, end_ns): in-process
GRPC = 5  # (GRPC, id, method, request bytes, metadata): a unary RPC answered in-process
STREAM_OPEN = 6  # (STREAM_OPEN, id, metadata): a ModelStreamInfer call began
STREAM_IN = 7  # (STREAM_IN, id, message bytes)
STREAM_END = 8  # (STREAM_END, id): the client sent its last message
# core -> worker
SETTINGS = 20  # (SETTINGS, pickled Settings): the first message a worker gets
STATE = 21  # (STATE, {name: value}): server state workers mirror (trace sampling on/off)
INFER_OK = 22  # (INFER_OK, id, response fields)
INFER_ERROR = 23  # (INFER_ERROR, id, ErrorCode value, message)
HTTP_RESPONSE = 24  # (HTTP_RESPONSE, id, status, headers, body)
HTTP_HEAD = 25  # (HTTP_HEAD, id, status, headers): a streamed response's head
HTTP_CHUNK = 26  # (HTTP_CHUNK, id, bytes)
HTTP_DONE = 27  # (HTTP_DONE, id): the streamed response ended
GRPC_OK = 28  # (GRPC_OK, id, response bytes)
GRPC_ERROR = 29  # (GRPC_ERROR, id, status code value, details)
STREAM_OUT = 30  # (STREAM_OUT, id, message bytes)
STREAM_DONE = 31  # (STREAM_DONE, id, status code value or 0, details)
DRAIN = 32  # (DRAIN,): stop accepting connections, finish what is in flight, exit


# Below this size a tensor's bytes are copied out (`tobytes`, one C call); above it a view
# saves the copy that marshal makes anyway.
_VIEW_BYTES = 64 * 1024


def _raw(array: np.ndarray) -> Any:
    if array.nbytes < _VIEW_BYTES:
        return array.tobytes()
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data


class NeedsCore(Exception):
    """Raised while a worker decodes a request it must forward to the core undecoded."""


# ---- requests ------------------------------------------------------------------------------------


def _tensor_fields(tensor: Tensor) -> tuple[Any, ...]:
    data = tensor.data
    datatype = datatypes.BY_NAME.get(tensor.datatype)
    if datatype is None or not isinstance(data, np.ndarray):
        raise NeedsCore
    if datatype.is_bytes:
        if data.dtype != np.dtype(object) or not all(isinstance(v, bytes) for v in data.flat):
            raise NeedsCore  # str elements, say: the core would see them as they are
        payload: Any = datatypes.serialize_bytes(data)
    elif data.dtype != datatype.dtype:
        raise NeedsCore  # the core's validation would see this dtype: let it
    else:
        payload = _raw(data)
    return (tensor.name, tensor.datatype, tensor.shape, payload, tensor.parameters or None)


def encode_request(request: InferRequest) -> tuple[Any, ...]:
    """The fields of a decoded request (raises NeedsCore for what only the core can carry)."""
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


def decode_request(fields: tuple[Any, ...]) -> InferRequest:
    name, version, request_id, inputs, outputs, parameters, received_ns = fields
    tensors = []
    for tensor_name, datatype_name, shape, payload, tensor_parameters in inputs:
        datatype = datatypes.BY_NAME[datatype_name]
        if datatype.is_bytes:
            data = bytes_elements(tensor_name, payload)
        else:
            data = np.frombuffer(payload, dtype=datatype.dtype)
        tensors.append(Tensor(tensor_name, datatype_name, shape, data, tensor_parameters or {}))
    requested = None
    if outputs is not None:
        requested = [RequestedOutput(n, p or {}) for n, p in outputs]
    return InferRequest(
        model_name=name,
        model_version=version,
        id=request_id,
        inputs=tensors,
        outputs=requested,
        parameters=parameters or {},
        received_ns=received_ns,
    )


# ---- responses -----------------------------------------------------------------------------------


def encode_response(response: InferResponse) -> tuple[Any, ...]:
    outputs = []
    for tensor in response.outputs:
        data = tensor.data
        if tensor.datatype == "BYTES":
            payload: Any = datatypes.serialize_bytes(data)
            dtype = ""
        else:
            payload = _raw(data)
            # Usually the datatype's own dtype; a Python model may answer in another one.
            same = data.dtype == datatypes.BY_NAME[tensor.datatype].dtype
            dtype = "" if same else data.dtype.str
        outputs.append((tensor.name, tensor.datatype, data.shape, payload, dtype))
    return (
        response.model_name,
        response.model_version,
        response.id,
        outputs,
        response.parameters or None,
    )


def decode_response(fields: tuple[Any, ...], request: InferRequest) -> InferResponse:
    """The response to `request` (which names the outputs the client asked for)."""
    name, version, response_id, outputs, parameters = fields
    tensors = []
    for tensor_name, datatype_name, shape, payload, dtype in outputs:
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
