"""pb_utils' types: the TRITONSERVER_* constants, datatypes, errors and Tensor.

Written after Triton's Python backend documentation: the same names, signatures and behaviour, so
model.py files written for Triton run unchanged (`utils.py` re-exports them as pb_utils).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from oceanus.core import datatypes
from oceanus.core.tensor_bytes import bytes_elements

if TYPE_CHECKING:
    from oceanus.backends.python.pb.requests import InferenceRequest, InferenceResponse

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
    return bytes_elements("", encoded_tensor)


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
        array: np.ndarray = self._array
        return array

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

        dtype: np.dtype = np.dtype(ml_dtypes.bfloat16)
        return dtype
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
