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


# A BYTES input may hold at most this many elements: each costs a Python object (~0.4 us and
# 40-60 bytes to decode), so millions of empty ones in a 16 MiB body cost seconds and hundreds of
# MB (issue 30). The request's shape says the count before anything is decoded.
MAX_BYTES_ELEMENTS = 1 << 20


def bytes_elements(
    name: str, chunk: bytes | memoryview | np.ndarray, limit: int | None = None
) -> np.ndarray:
    """Length-framed BYTES elements as a flat object array (Triton's texts when malformed).

    The one BYTES decoder (HTTP, gRPC, the Python backend's rings); its loop is kept to struct
    and bytes slicing, the fastest way tried (bench/README.md, "Figures behind code comments").
    `limit`: raise TooManyElements instead of decoding more than this many."""
    data = chunk if isinstance(chunk, bytes) else bytes(chunk)
    items: list[bytes] = []
    append = items.append
    offset, end = 0, len(data)
    if limit is not None and end // 4 > limit:
        # Could hold more than allowed: decode with a count (slower), stop at the first extra.
        end = _framed_end(name, data, limit)
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


class TooManyElements(Exception):
    """More BYTES elements than the caller's limit."""


def _framed_end(name: str, data: bytes, limit: int) -> int:
    """Where the first `limit` elements end; TooManyElements if more follow."""
    offset, end = 0, len(data)
    for _ in range(limit):
        if offset + 4 > end:
            return end  # the decoder reports a malformed tail with its own words
        (length,) = _LENGTH(data, offset)
        offset += 4 + length
    if offset < end:
        raise TooManyElements(name)
    return min(offset, end)


def check_bytes_count(name: str, count: int, model_name: str, request_id: str) -> None:
    """Refuse a BYTES input of more than MAX_BYTES_ELEMENTS elements (before decoding it)."""
    if count > MAX_BYTES_ELEMENTS:
        raise invalid_arg(
            f"[request id: {request_id or '<id_unknown>'}] inference input '{name}' for model "
            f"'{model_name}' has {count} string elements, more than the {MAX_BYTES_ELEMENTS} "
            "accepted in one tensor"
        )


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
        expected = 1
        for dim in shape:
            expected *= dim
        prefix = f"[request id: {request_id or '<id_unknown>'}] "
        check_bytes_count(name, expected, model_name, request_id)
        try:
            return bytes_elements(name, chunk, expected if expected >= 0 else MAX_BYTES_ELEMENTS)
        except TooManyElements:
            raise invalid_arg(
                f"{prefix}expected {expected} string elements for inference input '{name}' "
                f"for model '{model_name}', got more"
            ) from None
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
