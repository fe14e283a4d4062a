"""The tensors of one message in one ring block: packed by the writer, viewed by the reader.

A message carries descriptors (name, datatype, shape, offset, size) and the block's location,
never tensor bytes. Fixed-size datatypes are copied in as raw bytes and viewed back in place;
BYTES travel length-framed (4-byte little-endian length + bytes per element), as on Triton's wire.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from oceanus.core import datatypes
from oceanus.core.tensor_bytes import bytes_elements
from oceanus.ipc.rings import Location, RingReader, RingWriter

ALIGN = 64

TensorItem = tuple[str, str, np.ndarray]  # (name, datatype, array)
TensorDesc = tuple[str, str, tuple[int, ...], int, int]  # (name, datatype, shape, offset, nbytes)


def numpy_dtype(datatype: str) -> np.dtype:
    """The numpy dtype of a wire datatype name (object for BYTES)."""
    found = datatypes.BY_NAME.get(datatype)
    if found is None:
        raise ValueError(f"unknown datatype '{datatype}'")
    return found.dtype


def _raw(datatype: str, array: np.ndarray) -> np.ndarray:
    if datatype == "BYTES":
        return np.frombuffer(datatypes.serialize_bytes(array), dtype=np.uint8)
    contiguous = np.ascontiguousarray(array)
    return contiguous.reshape(-1).view(np.uint8)


def pack(
    writer: RingWriter, groups: Sequence[Sequence[TensorItem]]
) -> tuple[Location | None, list[list[TensorDesc]]]:
    """Copy every tensor of every group into one block; descriptors per group."""
    raws: list[list[tuple[str, str, tuple[int, ...], np.ndarray]]] = []
    total = 0
    for group in groups:
        items = []
        for name, datatype, array in group:
            raw = _raw(datatype, array)
            items.append((name, datatype, tuple(array.shape), raw))
            total += -(-raw.nbytes // ALIGN) * ALIGN
        raws.append(items)
    if total == 0:
        return None, [[(n, d, s, 0, 0) for n, d, s, _ in items] for items in raws]
    loc, view, mapping = writer.place(total)
    descs: list[list[TensorDesc]] = []
    offset = 0
    for items in raws:
        group_descs = []
        for name, datatype, shape, raw in items:
            size = raw.nbytes
            if size:
                view[offset : offset + size] = raw
            group_descs.append((name, datatype, shape, offset, size))
            offset += -(-size // ALIGN) * ALIGN
        descs.append(group_descs)
    if mapping is not None:
        del view
        mapping.close()
    return loc, descs


def unpack(block: np.ndarray | None, descs: Sequence[TensorDesc], copy: bool) -> list[TensorItem]:
    """Arrays of one group: views into the block, or copies (BYTES are always new objects)."""
    arrays: list[TensorItem] = []
    array: np.ndarray
    for name, datatype, shape, offset, size in descs:
        if datatype == "BYTES":
            if block is None or size == 0:
                array = np.empty(0, dtype=object)
            else:
                array = bytes_elements(name, block[offset : offset + size])
            arrays.append((name, datatype, array.reshape(shape)))
            continue
        dtype = numpy_dtype(datatype)
        if block is None or size == 0:
            array = np.empty(shape, dtype=dtype)
        else:
            array = block[offset : offset + size].view(dtype).reshape(shape)
            if copy:
                array = array.copy()
        arrays.append((name, datatype, array))
    return arrays


def unpack_copies(
    reader: RingReader, loc: Location | None, descs: Sequence[TensorDesc]
) -> list[TensorItem]:
    """One group's arrays as copies, its block released at once (a message with one group)."""
    block, token = reader.open(loc) if loc is not None else (None, None)
    try:
        return unpack(block, descs, copy=True)
    finally:
        reader.release(token)
