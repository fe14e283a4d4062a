"""Raw tensor bytes <-> numpy arrays, shared by every frontend that carries binary tensors.

(HTTP's binary tensor extension, gRPC's raw_input_contents / raw_output_contents.) Fixed-size
datatypes are viewed in place with `numpy.frombuffer` (no copy; the array is read-only and keeps the
buffer alive); BYTES elements are framed as 4-byte little-endian length + bytes.
"""

from __future__ import annotations

import numpy as np

from oceanus.core import datatypes
from oceanus.core.datatypes import DataType
from oceanus.core.errors import invalid_arg


def array_from_bytes(name: str, datatype: DataType, chunk: bytes | memoryview) -> np.ndarray:
    """A flat array over `chunk` (the caller checks the element count against the shape)."""
    if datatype.is_bytes:
        items = datatypes.deserialize_bytes(chunk)
        if items is None:
            raise invalid_arg(
                f"unexpected BYTES framing for input '{name}': each element needs a 4-byte "
                "length followed by that many bytes"
            )
        array = np.empty(len(items), dtype=object)
        array[:] = items
        return array
    if len(chunk) % datatype.itemsize:
        raise invalid_arg(
            f"input '{name}' holds {len(chunk)} bytes, not a whole number of "
            f"{datatype.name} elements of {datatype.itemsize} bytes"
        )
    return np.frombuffer(chunk, dtype=datatype.dtype)


def array_to_bytes(array: np.ndarray, datatype: str) -> bytes | memoryview:
    """The tensor's bytes in row-major order: a view where the array is contiguous."""
    if datatype == "BYTES":
        return datatypes.serialize_bytes(array)
    # a uint8 view works for every dtype, bfloat16 included (memoryview cannot format it)
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data
