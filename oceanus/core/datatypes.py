"""The datatype table: Triton wire names, config enums and numpy dtypes in one place."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

try:  # ml_dtypes ships with onnx; it gives numpy a real bfloat16.
    import ml_dtypes

    _BF16: np.dtype = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - onnx always brings it
    _BF16 = np.dtype(np.uint16)


@dataclass(frozen=True)
class DataType:
    """One Triton datatype.

    ``name`` is the wire name ("FP32"), ``config_name`` the ModelConfig enum ("TYPE_FP32"),
    ``dtype`` the numpy dtype used inside the server (object for BYTES), ``itemsize`` the bytes per
    element on the wire (0 for variable-size BYTES).
    """

    name: str
    config_name: str
    dtype: np.dtype
    itemsize: int

    @property
    def is_bytes(self) -> bool:
        return self.name == "BYTES"


def _entry(name: str, config_name: str, dtype: np.dtype) -> DataType:
    itemsize = 0 if dtype == np.dtype(object) else dtype.itemsize
    return DataType(name, config_name, dtype, itemsize)


_ALL: tuple[DataType, ...] = (
    _entry("BOOL", "TYPE_BOOL", np.dtype(np.bool_)),
    _entry("UINT8", "TYPE_UINT8", np.dtype(np.uint8)),
    _entry("UINT16", "TYPE_UINT16", np.dtype(np.uint16)),
    _entry("UINT32", "TYPE_UINT32", np.dtype(np.uint32)),
    _entry("UINT64", "TYPE_UINT64", np.dtype(np.uint64)),
    _entry("INT8", "TYPE_INT8", np.dtype(np.int8)),
    _entry("INT16", "TYPE_INT16", np.dtype(np.int16)),
    _entry("INT32", "TYPE_INT32", np.dtype(np.int32)),
    _entry("INT64", "TYPE_INT64", np.dtype(np.int64)),
    _entry("FP16", "TYPE_FP16", np.dtype(np.float16)),
    _entry("FP32", "TYPE_FP32", np.dtype(np.float32)),
    _entry("FP64", "TYPE_FP64", np.dtype(np.float64)),
    _entry("BYTES", "TYPE_STRING", np.dtype(object)),
    _entry("BF16", "TYPE_BF16", _BF16),
)

BY_NAME: dict[str, DataType] = {d.name: d for d in _ALL}
BY_CONFIG_NAME: dict[str, DataType] = {d.config_name: d for d in _ALL}
_BY_DTYPE: dict[np.dtype, DataType] = {d.dtype: d for d in _ALL}


# Triton's name for a datatype name it does not know, in its "data-type is '...'" error.
INVALID_DATATYPE = "<invalid>"


def from_name(name: str) -> DataType | None:
    """The datatype for a wire name such as "FP32", or None."""
    return BY_NAME.get(name)


def from_config_name(config_name: str) -> DataType | None:
    """The datatype for a ModelConfig enum name such as "TYPE_FP32", or None."""
    return BY_CONFIG_NAME.get(config_name)


def from_numpy(dtype: np.dtype) -> DataType | None:
    """The datatype for a numpy dtype (str/bytes/object arrays are BYTES), or None."""
    if dtype.kind in ("O", "S", "U"):
        return BY_NAME["BYTES"]
    return _BY_DTYPE.get(dtype)


def serialize_bytes(array: np.ndarray) -> bytes:
    """BYTES elements framed as 4-byte little-endian length + bytes, in row-major order (other
    objects are str()-encoded as UTF-8)."""
    parts: list[bytes] = []
    for item in array.reshape(-1):
        if isinstance(item, bytes):
            data = item
        elif isinstance(item, (bytearray, memoryview)):
            data = bytes(item)
        else:
            data = str(item).encode()
        parts.append(len(data).to_bytes(4, "little"))
        parts.append(data)
    return b"".join(parts)
