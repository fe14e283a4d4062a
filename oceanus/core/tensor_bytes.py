"""Raw tensor bytes <-> numpy arrays, shared by every frontend that carries binary tensors.

(HTTP's binary tensor extension, gRPC's raw_input_contents / raw_output_contents.) Fixed-size
datatypes are viewed in place with `numpy.frombuffer` (no copy; the array is read-only and keeps the
buffer alive); BYTES elements are framed as 4-byte little-endian length + bytes.
"""

from __future__ import annotations

import struct

import numpy as np

from oceanus.core import datatypes
from oceanus.core.datatypes import DataType
from oceanus.core.errors import invalid_arg

_LENGTH = struct.Struct("<I").unpack_from


def bytes_elements(name: str, chunk: bytes | memoryview | np.ndarray) -> np.ndarray:
    """Length-framed BYTES elements as a flat object array (Triton's texts when malformed).

    The one BYTES decoder (HTTP, gRPC, the Python backend's rings); its loop is kept to struct
    and bytes slicing, the fastest way tried (bench/README.md, "Figures behind code comments")."""
    data = chunk if isinstance(chunk, bytes) else bytes(chunk)
    items: list[bytes] = []
    append = items.append
    offset, end = 0, len(data)
    while offset < end:
        if offset + 4 > end:
            raise invalid_arg(
                f"incomplete string length for inference input '{name}', expecting 4 bytes "
                f"but only {end - offset} bytes available"
            )
        (length,) = _LENGTH(data, offset)
        offset += 4
        stop = offset + length
        if stop > end:
            raise invalid_arg(
                f"incomplete string data for inference input '{name}', expecting string of "
                f"length {length} but only {end - offset} bytes available"
            )
        append(data[offset:stop])
        offset = stop
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


def array_from_bytes(
    name: str,
    datatype: DataType,
    chunk: bytes | memoryview,
    shape: tuple[int, ...],
    model_name: str,
    request_id: str,
) -> np.ndarray:
    """A flat array over `chunk` (the core checks the element count against the shape)."""
    if datatype.is_bytes:
        return bytes_elements(name, chunk)
    if len(chunk) % datatype.itemsize:
        expected = datatype.itemsize
        for dim in shape:
            expected *= dim
        raise invalid_arg(
            f"[request id: {request_id or '<id_unknown>'}] input byte size mismatch for input "
            f"'{name}' for model '{model_name}'. Expected {expected}, got {len(chunk)}"
        )
    return np.frombuffer(chunk, dtype=datatype.dtype)


def array_to_bytes(array: np.ndarray, datatype: str) -> bytes | memoryview:
    """The tensor's bytes in row-major order: a view where the array is contiguous."""
    if datatype == "BYTES":
        return datatypes.serialize_bytes(array)
    # a uint8 view works for every dtype, bfloat16 included (memoryview cannot format it)
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data
