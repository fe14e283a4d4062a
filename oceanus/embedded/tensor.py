"""Tensors of the in-process API: numpy arrays (and any DLPack producer) in, arrays out.

Inputs are handed to the core as the caller's arrays (no copy) whenever they already are what
the core needs: a numpy array of a Triton datatype, or a CPU DLPack tensor seen through
`numpy.from_dlpack` (shares memory). Only text (str) and Python lists are converted. Outputs
are the arrays the model produced, exposed through `__dlpack__`, so `numpy.from_dlpack`,
`torch.from_dlpack` and `cupy.from_dlpack` read them in place.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

import numpy as np

from oceanus.core import datatypes
from oceanus.core.types import Tensor as CoreTensor
from oceanus.embedded.errors import InvalidArgumentError, UnsupportedError


class DataType(enum.Enum):
    """Triton's datatypes (TRITONSERVER_DataType's names; values are the wire names)."""

    BOOL = "BOOL"
    UINT8 = "UINT8"
    UINT16 = "UINT16"
    UINT32 = "UINT32"
    UINT64 = "UINT64"
    INT8 = "INT8"
    INT16 = "INT16"
    INT32 = "INT32"
    INT64 = "INT64"
    FP16 = "FP16"
    FP32 = "FP32"
    FP64 = "FP64"
    BYTES = "BYTES"
    BF16 = "BF16"


class MemoryType(enum.Enum):
    """Where a tensor's bytes are (TRITONSERVER_MemoryType's names); Oceanus serves from host
    memory only."""

    CPU = 0
    CPU_PINNED = 1
    GPU = 2


# DLPack's kDLCPU
_DLPACK_CPU = 1


class Tensor:
    """A tensor of a request or response: datatype, shape and the host array holding it."""

    __slots__ = ("_array", "data_type")

    def __init__(self, data_type: DataType, array: np.ndarray) -> None:
        self.data_type = data_type
        self._array = array

    @property
    def shape(self) -> list[int]:
        return list(self._array.shape)

    @property
    def memory_type(self) -> MemoryType:
        return MemoryType.CPU

    @property
    def memory_type_id(self) -> int:
        return 0

    @property
    def size(self) -> int:
        """Bytes of data (for BYTES: as Triton serializes them, length-prefixed)."""
        if self.data_type is DataType.BYTES:
            return len(datatypes.serialize_bytes(self._array))
        return int(self._array.nbytes)

    @property
    def data_ptr(self) -> int:
        if self.data_type is DataType.BYTES:
            raise UnsupportedError("BYTES tensors hold Python objects, not a host buffer")
        return int(self._array.ctypes.data)

    def __repr__(self) -> str:
        return f"Tensor(data_type={self.data_type.name}, shape={self.shape})"

    # ---- DLPack and numpy ---------------------------------------------------------------------

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        if self.data_type is DataType.BYTES:
            raise UnsupportedError(
                "DLPack has no BYTES datatype: use to_bytes_array() or to_string_array()"
            )
        return self._array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_DLPACK_CPU, 0)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        array = self._array
        if dtype is not None and np.dtype(dtype) != array.dtype:
            return array.astype(dtype)
        return array.copy() if copy else array

    def to_host(self) -> Tensor:
        return self

    def to_device(self, device: Any) -> Tensor:
        if device in ("cpu", MemoryType.CPU, (MemoryType.CPU, 0)):
            return self
        raise UnsupportedError(f"Conversion from CPU to {device} not supported.")

    def to_bytes_array(self) -> np.ndarray:
        """A BYTES tensor as a numpy array of `bytes` objects (the output itself, no copy)."""
        if self.data_type is not DataType.BYTES:
            raise InvalidArgumentError(
                f"Tensor has data type {self.data_type.name} not {DataType.BYTES.name}"
            )
        return self._array

    def to_string_array(self) -> np.ndarray:
        """A BYTES tensor as a numpy array of `str` (UTF-8 decoded)."""
        return self.to_bytes_array().astype(str)

    # ---- constructors -------------------------------------------------------------------------

    @staticmethod
    def from_dlpack(obj: Any) -> Tensor:
        """A tensor sharing memory with any CPU DLPack producer (numpy, torch, ...)."""
        if isinstance(obj, np.ndarray):
            return Tensor._from_array(obj)
        try:
            array = np.from_dlpack(obj)
        except (BufferError, RuntimeError, TypeError) as exc:
            raise UnsupportedError(
                f"cannot read {type(obj).__name__} through DLPack ({exc}); Oceanus takes host "
                "memory tensors"
            ) from None
        return Tensor._from_array(array)

    @staticmethod
    def from_bytes_array(array: Sequence[Any] | np.ndarray) -> Tensor:
        tensor = Tensor._from_object(array)
        if tensor.data_type is not DataType.BYTES:
            raise InvalidArgumentError(
                f"Unsupported conversion to a BYTES tensor from {tensor.data_type.name} data"
            )
        return tensor

    @staticmethod
    def from_string_array(array: Sequence[str] | np.ndarray) -> Tensor:
        return Tensor.from_bytes_array(array)

    @staticmethod
    def _from_object(obj: Any) -> Tensor:
        """An input as the caller gave it: a Tensor, a numpy array, a DLPack producer or a
        (nested) list."""
        if isinstance(obj, Tensor):
            return obj
        if isinstance(obj, np.ndarray):
            return Tensor._from_array(obj)
        if hasattr(obj, "__dlpack__"):
            return Tensor.from_dlpack(obj)
        if isinstance(obj, (list, tuple)):
            return Tensor._from_array(np.array(obj))
        raise InvalidArgumentError(
            f"Input type {type(obj).__name__} not supported: give a numpy array, a list or an "
            "object with __dlpack__"
        )

    @staticmethod
    def _from_array(array: np.ndarray) -> Tensor:
        kind = array.dtype.kind
        if kind in ("U", "S"):
            # Text becomes the core's BYTES form: an object array of UTF-8 `bytes`.
            encoded = np.empty(array.shape, dtype=object)
            flat = encoded.reshape(-1)
            for index, item in enumerate(array.reshape(-1)):
                flat[index] = item.encode() if isinstance(item, str) else bytes(item)
            return Tensor(DataType.BYTES, encoded)
        if kind == "O":
            if any(isinstance(item, str) for item in array.reshape(-1)):
                array = np.array(
                    [i.encode() if isinstance(i, str) else i for i in array.reshape(-1)],
                    dtype=object,
                ).reshape(array.shape)
            return Tensor(DataType.BYTES, array)
        found = datatypes.from_numpy(array.dtype)
        if found is None:
            raise InvalidArgumentError(f"numpy dtype {array.dtype} has no Triton datatype")
        return Tensor(DataType(found.name), array)

    @staticmethod
    def _from_core(tensor: CoreTensor) -> Tensor:
        return Tensor(DataType(tensor.datatype), tensor.data)

    def _to_core(self, name: str) -> CoreTensor:
        array = self._array
        return CoreTensor(name, self.data_type.value, tuple(array.shape), array)
