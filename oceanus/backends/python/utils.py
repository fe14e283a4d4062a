"""The `triton_python_backend_utils` API that model.py files import (as `pb_utils`).

Written for Oceanus after Triton's Python backend documentation: the same names, signatures and
behaviour, so model.py files written for Triton run unchanged. Inside a worker process the
top-level module `triton_python_backend_utils` is this module. Outside a worker (in a unit test,
say) everything works except what needs the server: BLS `exec`, response senders, cancellation
queries and logging to the server log (which then goes to Python's logging).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np

from oceanus.backends.python import transport
from oceanus.core import datatypes

__all__ = [
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_CPU_PINNED",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITON_STRING_TO_NUMPY",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "Logger",
    "Metric",
    "MetricFamily",
    "ModelConfig",
    "PreferredMemory",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "is_model_ready",
    "load_model",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "unload_model",
    "using_decoupled_model_transaction_policy",
]

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_CPU_PINNED = 1
TRITONSERVER_MEMORY_GPU = 2

# ---- datatypes ----------------------------------------------------------------------------------

TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

# TRITONSERVER_DataType numbers <-> wire names <-> numpy
_CODE_TO_WIRE = {
    1: "BOOL",
    2: "UINT8",
    3: "UINT16",
    4: "UINT32",
    5: "UINT64",
    6: "INT8",
    7: "INT16",
    8: "INT32",
    9: "INT64",
    10: "FP16",
    11: "FP32",
    12: "FP64",
    13: "BYTES",
    14: "BF16",
}
_WIRE_TO_CODE = {wire: code for code, wire in _CODE_TO_WIRE.items()}
_CODE_TO_NUMPY: dict[int, Any] = {
    1: np.bool_,
    2: np.uint8,
    3: np.uint16,
    4: np.uint32,
    5: np.uint64,
    6: np.int8,
    7: np.int16,
    8: np.int32,
    9: np.int64,
    10: np.float16,
    11: np.float32,
    12: np.float64,
    13: np.object_,
}


def triton_to_numpy_type(data_type: int) -> Any:
    """The numpy type of a TRITONSERVER_DataType number (13, BYTES, is np.object_)."""
    return _CODE_TO_NUMPY.get(data_type)


def numpy_to_triton_type(data_type: Any) -> int | None:
    """The TRITONSERVER_DataType number of a numpy type or dtype, or None."""
    found = _NUMPY_TO_CODE.get(data_type)
    if found is not None:
        return found
    try:
        dtype = np.dtype(data_type)
    except TypeError:
        return None
    if dtype.kind in ("O", "S"):
        return 13
    if dtype.name == "bfloat16":
        return 14
    return _NUMPY_TO_CODE.get(dtype)


# numpy types and dtypes -> TRITONSERVER_DataType numbers (dtypes hash like their types)
_NUMPY_TO_CODE: dict[Any, int] = {
    np.dtype(numpy_type): code for code, numpy_type in _CODE_TO_NUMPY.items() if code != 13
}
_NUMPY_TO_CODE.update(
    {numpy_type: code for code, numpy_type in _CODE_TO_NUMPY.items() if code != 13}
)
_NUMPY_TO_CODE.update({np.dtype(np.object_): 13, np.object_: 13, np.bytes_: 13, bool: 1})


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """The numpy type of a config datatype name such as "TYPE_FP32"."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes | None:
    """BYTES elements flattened in C order as 4-byte little-endian length + bytes.

    Object arrays may hold bytes (kept as is) or anything else (str() encoded as UTF-8); np.bytes_
    arrays are accepted too. Returns None for other dtypes and b"" for an empty tensor."""
    if input_tensor.size == 0:
        return b""
    if input_tensor.dtype != np.object_ and input_tensor.dtype.type != np.bytes_:
        return None
    return datatypes.serialize_bytes(input_tensor)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """The inverse of `serialize_byte_tensor`: a flat object array of bytes."""
    return transport.deserialize_bytes(encoded_tensor)


# ---- errors -------------------------------------------------------------------------------------


class TritonError:
    """An error for one response: `InferenceResponse(error=TritonError("msg", code))`."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, msg: str, code: int = INTERNAL) -> None:
        self._msg = msg
        self._code = code

    def message(self) -> str:
        return self._msg

    def code(self) -> int:
        return self._code

    def __str__(self) -> str:
        return self._msg

    def __repr__(self) -> str:
        return f"TritonError({self._msg!r}, {self._code})"


# TritonError codes <-> the core's error code names (oceanus.core.errors.ErrorCode)
ERROR_CODE_NAMES = {
    TritonError.UNKNOWN: "UNKNOWN",
    TritonError.INTERNAL: "INTERNAL",
    TritonError.NOT_FOUND: "NOT_FOUND",
    TritonError.INVALID_ARG: "INVALID_ARG",
    TritonError.UNAVAILABLE: "UNAVAILABLE",
    TritonError.UNSUPPORTED: "UNSUPPORTED",
    TritonError.ALREADY_EXISTS: "ALREADY_EXISTS",
    TritonError.CANCELLED: "CANCELLED",
}
ERROR_CODES_BY_NAME = {name: code for code, name in ERROR_CODE_NAMES.items()}


class TritonModelException(Exception):
    """Raised by model code (or by this API) to fail the whole call."""

    def __init__(self, msg: str = "") -> None:
        super().__init__(msg)
        self._msg = msg

    def message(self) -> str:
        return self._msg


# ---- tensors ------------------------------------------------------------------------------------


class _Capsule:
    """Wraps a bare DLPack capsule so numpy.from_dlpack can take it (CPU only)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


class Tensor:
    """A named tensor of a request or a response, backed by a numpy array.

    Input tensors view the request's shared memory: they are valid during `execute` only (copy
    an array to keep it). BYTES tensors are object arrays of `bytes`."""

    def __init__(self, name: str, numpy_array: Any = None, triton_dtype: int | None = None) -> None:
        if not isinstance(numpy_array, np.ndarray):
            if isinstance(numpy_array, (list, tuple)):
                numpy_array = np.array(numpy_array)
            else:
                raise TritonModelException(
                    f"Tensor '{name}': numpy_array must be a numpy.ndarray, got "
                    f"{type(numpy_array).__name__}"
                )
        if numpy_array.dtype.type == np.str_ or numpy_array.dtype == np.void:
            raise TritonModelException(
                "Tensor dtype used for numpy_array is not support by Python backend. "
                "Please use np.object_ instead."
            )
        if triton_dtype is not None:
            if triton_dtype == 14:
                wanted = _bf16_dtype()
            else:
                wanted = np.dtype(_CODE_TO_NUMPY.get(triton_dtype, numpy_array.dtype))
            if numpy_array.dtype != wanted:
                numpy_array = numpy_array.view(wanted)
        else:
            triton_dtype = numpy_to_triton_type(numpy_array.dtype)
            if triton_dtype is None:
                raise TritonModelException(
                    f"Tensor '{name}': numpy dtype {numpy_array.dtype} has no Triton datatype"
                )
        self._name = name
        self._array = numpy_array
        self._triton_dtype = triton_dtype

    @classmethod
    def _wrap(cls, name: str, datatype: str, array: np.ndarray) -> Tensor:
        """A tensor over an array already known to match `datatype` (no checks)."""
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._array = array
        tensor._triton_dtype = _WIRE_TO_CODE[datatype]
        return tensor

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def triton_dtype(self) -> int:
        return self._triton_dtype

    def datatype(self) -> str:
        """The wire datatype name ("FP32", "BYTES", ...)."""
        return _CODE_TO_WIRE[self._triton_dtype]

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        """A DLPack capsule over the tensor's memory (zero copy; not for BYTES)."""
        if self._array.dtype == np.object_:
            raise TritonModelException("DLPack does not support BYTES tensors")
        return self._array.__dlpack__()

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)

    @staticmethod
    def from_dlpack(name: str, dlpack_tensor: Any) -> Tensor:
        """A tensor from a DLPack capsule or any object with `__dlpack__` (CPU memory only)."""
        source = dlpack_tensor
        if not hasattr(source, "__dlpack__"):
            source = _Capsule(source)
        else:
            device = source.__dlpack_device__()
            if int(device[0]) not in (1, 3):  # kDLCPU, kDLCUDAHost
                raise TritonModelException(
                    "Tensor.from_dlpack: only tensors in CPU memory are supported by Oceanus"
                )
        array = np.from_dlpack(source)
        if not array.flags.c_contiguous:
            raise TritonModelException(
                "DLPack tensor is not contiguous. Only contiguous DLPack "
                "tensors that are stored in C-Order are supported."
            )
        return Tensor(name, array)

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, {self.datatype()}, shape={self.shape()})"


def _bf16_dtype() -> np.dtype:
    try:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    except ImportError:  # pragma: no cover
        return np.dtype(np.uint16)


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for entry in model_config.get("input", ()):
        if entry["name"] == name:
            return dict(entry)
    return None


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for entry in model_config.get("output", ()):
        if entry["name"] == name:
            return dict(entry)
    return None


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    policy = model_config.get("model_transaction_policy")
    return bool(policy and policy.get("decoupled", False))


# ---- the worker's services (set by the worker process) ------------------------------------------


class _Runtime:
    """What only the worker process can do; the worker installs a subclass."""

    model_name = ""

    def send_response(self, key: int, response: InferenceResponse | None, flags: int) -> None:
        raise TritonModelException("response senders work only inside a running model")

    def is_cancelled(self, key: int) -> bool:
        return False

    def bls(self, request: InferenceRequest, decoupled: bool) -> Any:
        raise TritonModelException("BLS requests work only inside a running model")

    def log(self, level: str, message: str) -> None:
        logging.getLogger("triton_python_backend_utils").log(
            {"INFO": logging.INFO, "WARNING": logging.WARNING, "ERROR": logging.ERROR}.get(
                level, logging.DEBUG
            ),
            message,
        )

    def server_call(self, operation: str, *args: Any) -> Any:
        """Ask the server (model readiness, load, unload) and wait for its answer; raises
        TritonModelException with the server's error."""
        if operation == "model_ready":
            return False
        raise TritonModelException(f"pb_utils.{operation} works only inside a running model")

    # Custom metrics: outside a worker they live in this process.
    _metrics: Any = None

    def _metric_owner(self) -> Any:
        if self._metrics is None:
            from oceanus.core.custom_metrics import CustomMetricRegistry

            self._metrics = CustomMetricRegistry().owner()
        return self._metrics

    def metric_call(self, operation: str, *args: Any) -> Any:
        """family_new / metric_new / metric_value: answered; raises TritonModelException."""
        from oceanus.core.custom_metrics import MetricError

        owner = self._metric_owner()
        try:
            if operation == "family_new":
                return owner.new_family(*args)
            if operation == "metric_new":
                return owner.new_metric(*args)
            return owner.value(*args)
        except MetricError as exc:
            raise TritonModelException(str(exc)) from None

    def metric_update(self, metric_id: int, operation: str, value: float) -> None:
        self._metric_owner().update(metric_id, operation, value)

    def metric_delete(self, what: str, number: int) -> None:
        owner = self._metric_owner()
        if what == "family":
            owner.delete_family(number)
        else:
            owner.delete_metric(number)

    def wait(self, done: Any) -> None:
        """Block until done() (the worker reads its messages meanwhile)."""

    def poke(self) -> None:
        """Something a waiter may be waiting for happened."""


_runtime = _Runtime()


def _set_runtime(runtime: _Runtime) -> None:
    global _runtime
    _runtime = runtime


# ---- requests and responses ---------------------------------------------------------------------


class PreferredMemory:
    """Where BLS outputs should live; Oceanus always returns them in CPU memory."""

    def __init__(
        self, preferred_memory_type: int = TRITONSERVER_MEMORY_CPU, preferred_device_id: int = 0
    ) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


class InferenceResponse:
    """One response: output tensors, or an error; optional parameters (bool, int or str)."""

    def __init__(
        self,
        output_tensors: list[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        if output_tensors is None:
            output_tensors = []
        if not isinstance(output_tensors, list):
            raise TritonModelException('"output_tensors" must be a list.')
        for tensor in output_tensors:
            if not isinstance(tensor, Tensor):
                raise TritonModelException(
                    f"output_tensors must hold pb_utils.Tensor objects, found "
                    f"'{type(tensor).__name__}'"
                )
        if error is not None and not isinstance(error, TritonError):
            raise TritonModelException("error must be a pb_utils.TritonError")
        self._output_tensors = output_tensors
        self._error = error
        self._parameters = _parameters_json(parameters)

    def output_tensors(self) -> list[Tensor]:
        return self._output_tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters


def _parameters_json(parameters: dict[str, Any] | str | None) -> str:
    if parameters is None:
        return "{}"
    parsed = json.loads(parameters) if isinstance(parameters, str) else parameters
    if not isinstance(parsed, dict):
        raise TritonModelException("parameters must be a dictionary")
    for key, value in parsed.items():
        if not isinstance(key, str) or not isinstance(value, (bool, int, str)):
            raise TritonModelException(
                "Expect parameters keys to have type str and values to have type bool, int or str"
            )
    return json.dumps(parsed)


_SENDER_LOCK = threading.Lock()


class InferenceResponseSender:
    """Sends the responses of one request (decoupled models: any number, then the FINAL flag)."""

    def __init__(self, key: int, decoupled: bool) -> None:
        self._key = key
        self._decoupled = decoupled
        self._closed = False
        self._sent = 0
        self._lock = threading.Lock()
        self.done = threading.Event()

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        with self._lock:
            if self._closed:
                raise TritonModelException(
                    "Unable to send response. Response sender has been closed."
                )
            if response is None and not flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                raise TritonModelException(
                    "Inference Response object must be provided when the response flags is "
                    "not set to TRITONSERVER_RESPONSE_COMPLETE_FINAL."
                )
            if response is not None and not isinstance(response, InferenceResponse):
                raise TritonModelException(
                    "send() expects a pb_utils.InferenceResponse, found "
                    f"'{type(response).__name__}'"
                )
            if not self._decoupled and response is not None and self._sent:
                raise TritonModelException(
                    "Non-decoupled model cannot send more than one response."
                )
            if response is not None:
                self._sent += 1
            final = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            if final:
                if not self._decoupled and not self._sent:
                    raise TritonModelException(
                        "Non-decoupled model must send one response before the final flag."
                    )
                self._closed = True
            _runtime.send_response(self._key, response, flags)
            if final:
                self.done.set()
        if final:
            _runtime.poke()

    def is_cancelled(self) -> bool:
        return _runtime.is_cancelled(self._key)

    def _close(self) -> None:
        with self._lock:
            self._closed = True
            self.done.set()

    @property
    def closed(self) -> bool:
        return self._closed


class InferenceRequest:
    """A request given to `execute`, or one built by the model for BLS:

    pb_utils.InferenceRequest(model_name="m", inputs=[...], requested_output_names=[...])
        .exec() / await .async_exec()
    """

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: list[Tensor] | None = None,
        requested_output_names: list[str] | None = None,
        model_name: str = "",
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: PreferredMemory | None = None,
        trace: Any = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._inputs = list(inputs or [])
        self._requested_output_names = list(requested_output_names or [])
        self._model_name = model_name
        self._model_version = model_version
        self._flags = flags
        self._timeout = timeout
        self._preferred_memory = preferred_memory or PreferredMemory()
        self._trace = trace
        self._parameters = _parameters_json(parameters)
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        self._key = -1
        self._decoupled = False
        self._sender: InferenceResponseSender | None = None

    @classmethod
    def _received(
        cls,
        key: int,
        request_id: str,
        correlation_id: int | str,
        flags: int,
        timeout: int,
        parameters: str,
        requested_output_names: list[str],
        inputs: list[Tensor],
        model_name: str,
        model_version: int,
        decoupled: bool,
    ) -> InferenceRequest:
        request = cls.__new__(cls)
        request._request_id = request_id
        request._correlation_id = correlation_id
        request._inputs = inputs
        request._requested_output_names = requested_output_names
        request._model_name = model_name
        request._model_version = model_version
        request._flags = flags
        request._timeout = timeout
        request._preferred_memory = PreferredMemory()
        request._trace = None
        request._parameters = parameters
        request._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        request._key = key
        request._decoupled = decoupled
        request._sender = None  # made on first use: most models never ask for it
        return request

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        return self._parameters

    def requested_output_names(self) -> list[str]:
        return self._requested_output_names

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def trace(self) -> Any:
        return self._trace

    def is_cancelled(self) -> bool:
        if self._key < 0:
            return False
        return _runtime.is_cancelled(self._key)

    def get_response_sender(self) -> InferenceResponseSender:
        if self._key < 0:
            raise TritonModelException("only requests given to execute() have a response sender")
        with _SENDER_LOCK:
            if self._sender is None:
                self._sender = InferenceResponseSender(self._key, self._decoupled)
            return self._sender

    def set_release_flags(self, flags: int) -> None:
        if flags != TRITONSERVER_REQUEST_RELEASE_ALL:
            raise TritonModelException(
                "request rescheduling (TRITONSERVER_REQUEST_RELEASE_RESCHEDULE) needs iterative "
                "sequence batching, which Oceanus does not implement"
            )
        self._release_flags = flags

    def release_flags(self) -> int:
        return self._release_flags

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on `model_name` and wait: an InferenceResponse (with `error()` set on
        failure), or for `decoupled=True` an iterator of responses."""
        self._check_bls()
        future = _runtime.bls(self, decoupled)
        _runtime.wait(future.done)
        return future.result()

    def async_exec(self, decoupled: bool = False) -> Any:
        """Like `exec`, as an awaitable (use from `async def execute`)."""
        self._check_bls()
        return asyncio.wrap_future(_runtime.bls(self, decoupled))

    def _check_bls(self) -> None:
        if not self._model_name:
            raise TritonModelException("BLS requests must name the model (model_name=...)")


class ResponseIterator:
    """The responses of a decoupled BLS request, in order; iterate with `for` or `async for`."""

    def __init__(self) -> None:
        import queue

        self._queue: queue.SimpleQueue[InferenceResponse | None] = queue.SimpleQueue()
        self._done = False

    def _put(self, response: InferenceResponse | None) -> None:
        self._queue.put(response)

    def __iter__(self) -> Iterator[InferenceResponse]:
        return self

    def __next__(self) -> InferenceResponse:
        if self._done:
            raise StopIteration
        _runtime.wait(lambda: not self._queue.empty())
        item = self._queue.get()
        if item is None:
            self._done = True
            raise StopIteration
        return item

    def __aiter__(self) -> AsyncIterator[InferenceResponse]:
        return self

    async def __anext__(self) -> InferenceResponse:
        if self._done:
            raise StopAsyncIteration
        try:
            return await asyncio.get_running_loop().run_in_executor(None, self.__next__)
        except StopIteration:
            raise StopAsyncIteration from None

    def cancel(self) -> None:
        """Accepted for compatibility; the request runs to completion."""


# ---- model loading API --------------------------------------------------------------------------


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether the server reports the model (version) ready, as its ready endpoint does."""
    if model_version:
        try:
            number = int(model_version)
        except ValueError:
            raise TritonModelException(
                "Failed to check model readiness: failed to get model version from specified "
                f"version string '{model_version}' (details: stol), version should be an "
                "integral value > 0"
            ) from None
        if number < 0:
            raise TritonModelException(
                "Failed to check model readiness: failed to get model version from specified "
                f"version string '{model_version}', version should be an integral value > 0"
            )
    return bool(_runtime.server_call("model_ready", model_name, model_version))


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) a model, as the repository extension's load does: only when the server
    runs with `--model-control-mode=explicit`. `config`: a config override in JSON; `files`:
    {"file:<version>/<name>": bytes} forming the model's folder (needs `config`)."""
    if files is not None and not isinstance(files, dict):
        raise TritonModelException(
            f"failed to load model '{model_name}', files should be a dictionary of file paths "
            "and file contents"
        )
    contents = {str(k): bytes(v) for k, v in (files or {}).items()}
    try:
        _runtime.server_call("load_model", model_name, config or "", contents)
    except TritonModelException as exc:
        raise TritonModelException(f"Failed to load model: {exc.message()}") from None


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload a model (explicit model control mode only). Returns once it is unloaded."""
    try:
        _runtime.server_call("unload_model", model_name, bool(unload_dependents))
    except TritonModelException as exc:
        raise TritonModelException(f"Failed to unload model: {exc.message()}") from None


# ---- logging ------------------------------------------------------------------------------------


class Logger:
    """Writes to the server's log: `pb_utils.Logger.log_info("...")`."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3
    _LEVELS = {0: "INFO", 1: "WARNING", 2: "ERROR", 3: "VERBOSE"}

    @staticmethod
    def log(message: str, level: int = 0) -> None:
        _runtime.log(Logger._LEVELS.get(level, "INFO"), str(message))

    @staticmethod
    def log_info(message: str) -> None:
        _runtime.log("INFO", str(message))

    @staticmethod
    def log_warn(message: str) -> None:
        _runtime.log("WARNING", str(message))

    @staticmethod
    def log_error(message: str) -> None:
        _runtime.log("ERROR", str(message))

    @staticmethod
    def log_verbose(message: str) -> None:
        _runtime.log("VERBOSE", str(message))


# ---- custom metrics -----------------------------------------------------------------------------

# Deletions noted by __del__ (which may run inside any other call, under any lock, when the
# garbage collector runs); sent before the next metric call or at the end of execute.
_DEFERRED: collections.deque[tuple[str, int]] = collections.deque()
_METRIC_IDS = itertools.count(1)
_KIND_NAMES = {0: "counter", 1: "gauge", 2: "histogram"}
_CLEARED = (
    "Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The "
    "'MetricFamily' object should be deleted AFTER its corresponding 'Metric' objects have been "
    "deleted."
)


def _flush_deferred() -> None:
    while _DEFERRED:
        try:
            what, number = _DEFERRED.popleft()
        except IndexError:
            return
        _runtime.metric_delete(what, number)


class Metric:
    """One labelled metric of a MetricFamily. Its value lives in the server: operations are sent
    to it (increment/set/observe without waiting; `value()` asks), and /metrics exports it."""

    def __init__(
        self, family: MetricFamily, labels: dict[str, str], buckets: list[float] | None
    ) -> None:
        self._id = next(_METRIC_IDS)
        self._kind = family._kind
        self._cleared = True  # until the server accepted it
        _flush_deferred()
        try:
            _runtime.metric_call("metric_new", self._id, family._id, labels, buckets)
        except TritonModelException as exc:
            raise TritonModelException(f"Error when creating Metric: {exc.message()}") from None
        self._cleared = False

    def _update(self, operation: str, value: float, failure: str) -> None:
        if self._cleared:
            raise TritonModelException(f"{failure}: {_CLEARED}")
        kind = self._kind
        refused = None
        if operation == "increment":
            if kind == MetricFamily.COUNTER and value < 0:
                refused = (
                    "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically "
                    "by non-negative values."
                )
            elif kind == MetricFamily.HISTOGRAM:
                refused = "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Increment"
        elif operation == "set" and kind != MetricFamily.GAUGE:
            refused = f"TRITONSERVER_METRIC_KIND_{_KIND_NAMES[kind].upper()} does not support Set"
        elif operation == "observe" and kind != MetricFamily.HISTOGRAM:
            refused = (
                f"TRITONSERVER_METRIC_KIND_{_KIND_NAMES[kind].upper()} does not support Observe"
            )
        if refused is not None:
            raise TritonModelException(f"{failure}: {refused}")
        _flush_deferred()
        _runtime.metric_update(self._id, operation, float(value))

    def increment(self, value: float) -> None:
        self._update("increment", value, "Failed to increment metric value")

    def set(self, value: float) -> None:
        self._update("set", value, "Failed to set metric value")

    def observe(self, value: float) -> None:
        self._update("observe", value, "Failed to observe metric value")

    def value(self) -> float:
        if self._cleared:
            raise TritonModelException(f"Failed to get metric value: {_CLEARED}")
        _flush_deferred()
        try:
            return float(_runtime.metric_call("metric_value", self._id))
        except TritonModelException as exc:
            raise TritonModelException(f"Failed to get metric value: {exc.message()}") from None

    def __del__(self) -> None:
        if not getattr(self, "_cleared", True):
            _DEFERRED.append(("metric", self._id))


class MetricFamily:
    """Triton's custom metrics API: `MetricFamily(name, description, kind)`, then
    `family.Metric(labels={...})` (histograms: `buckets=[...]`). Families and their metrics are
    kept by the server and exported on its /metrics endpoint; deleting a family (or unloading the
    model) removes it and its metrics there."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2

    def __init__(self, name: str, description: str, kind: int) -> None:
        if kind not in (self.COUNTER, self.GAUGE, self.HISTOGRAM):
            raise TritonModelException("MetricFamily kind must be COUNTER, GAUGE or HISTOGRAM")
        self._id = next(_METRIC_IDS)
        self._name = name
        self._description = description
        self._kind = kind
        # The family keeps its metrics (as Triton's does): they go when the family goes.
        self._metrics: list[Metric] = []
        self._created = False
        _flush_deferred()
        try:
            _runtime.metric_call(
                "family_new", self._id, str(name), str(description), _KIND_NAMES[kind]
            )
        except TritonModelException as exc:
            raise TritonModelException(
                f"Error when creating MetricFamily: {exc.message()}"
            ) from None
        self._created = True

    def Metric(
        self, labels: dict[str, str] | None = None, buckets: list[float] | None = None
    ) -> Metric:
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        if buckets is not None:
            if not isinstance(buckets, list):
                raise TritonModelException("Failed to create metric. Buckets must be a list.")
            if self._kind != self.HISTOGRAM:
                raise TritonModelException("Failed to create metric. Unexpected buckets found.")
            buckets = [float(b) for b in buckets]
        elif self._kind == self.HISTOGRAM:
            raise TritonModelException("Failed to create metric. Missing required buckets.")
        metric = Metric(self, {str(k): str(v) for k, v in (labels or {}).items()}, buckets)
        self._metrics.append(metric)
        return metric

    def __del__(self) -> None:
        if not getattr(self, "_created", False):
            return
        for metric in self._metrics:
            metric._cleared = True
        self._metrics = []
        _DEFERRED.append(("family", self._id))


# ---- auto-complete ------------------------------------------------------------------------------


class ModelConfig:
    """The config given to `auto_complete_config`; only max_batch_size, dynamic batching, inputs,
    outputs and the transaction policy may be changed."""

    def __init__(self, model_config: str | dict[str, Any]) -> None:
        self._config: dict[str, Any] = (
            json.loads(model_config) if isinstance(model_config, str) else model_config
        )
        self._config.setdefault("input", [])
        self._config.setdefault("output", [])
        self._config.setdefault("max_batch_size", 0)

    def as_dict(self) -> dict[str, Any]:
        return self._config

    def _name(self) -> str:
        return str(self._config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = int(self._config.get("max_batch_size", 0))
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config "
                f"function for model '{self._name()}' specified max_batch_size {max_batch_size}"
            )
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but "
                    f"auto-complete-config function for model '{self._name()}' tries to set "
                    "scheduling_choice as 'dynamic_batching'"
                )
        self._config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:
        self._add("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output, ("name", "data_type", "dims"))

    def _add(self, kind: str, tensor: dict[str, Any], allowed: tuple[str, ...]) -> None:
        name = tensor.get("name")
        where = f"in auto-complete-config function for model '{self._name()}'"
        for key in tensor:
            if key not in allowed:
                listed = ", ".join(f"'{a}'" for a in allowed[:-1]) + f" and '{allowed[-1]}'"
                raise ValueError(f"{kind} '{name}' {where} contains property other than {listed}.")
        if name is None:
            raise ValueError(f"{kind} {where} is missing 'name' property.")
        for required in ("data_type", "dims"):
            if required not in tensor:
                raise ValueError(f"{kind} '{name}' {where} is missing '{required}' property.")
        for current in self._config[kind]:
            if current.get("name") != name:
                continue
            current_type = current.get("data_type", "TYPE_INVALID")
            if current_type not in ("TYPE_INVALID", tensor["data_type"]):
                raise ValueError(
                    f"unable to load model '{self._name()}', configuration expects datatype "
                    f"{current_type} for {kind} '{name}', model provides {tensor['data_type']}"
                )
            if current.get("dims") and list(current["dims"]) != list(tensor["dims"]):
                raise ValueError(
                    f"model '{self._name()}', tensor '{name}': the model expects dims "
                    f"{list(tensor['dims'])} but the model configuration specifies dims "
                    f"{list(current['dims'])}"
                )
            current["data_type"] = tensor["data_type"]
            current["dims"] = list(tensor["dims"])
            if "optional" in tensor:
                current["optional"] = tensor["optional"]
            return
        self._config[kind].append(dict(tensor))

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    "model transaction property in auto-complete-config function for model "
                    f"'{self._name()}' contains property other than 'decoupled'."
                )
        policy = self._config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = bool(transaction_policy_dict["decoupled"])
            if "decoupled" in policy and bool(policy["decoupled"]) != wanted:
                raise ValueError(
                    "trying to change decoupled property in auto-complete-config for model "
                    f"'{self._name()}', which is already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = wanted
