"""Single-producer rings in shared memory: the bytes of tensors, one direction each.

A ring is a file in /dev/shm mapped by both processes. The writer places the tensors of one
message in one contiguous block and sends the block's location with the message; the reader views
(or copies) the arrays in place and, once done with the block, advances the ring's tail (a 64-bit
counter in the ring's header) so the writer may reuse the space. Blocks are released in the order
they were received; a block released early waits for the blocks before it. A message that does
not fit in the free part of the ring goes through a one-off file that the reader unlinks as soon
as it has mapped it, so a full ring never blocks a writer (which could otherwise deadlock with a
reader waiting on it).

Every file is reserved (budget.reserve, posix_fallocate) when it is made, never left sparse: a
ring that does not fit in /dev/shm fails its creation with budget.ShmFull, and a one-off file
that does not fit is replaced by the message's own bytes sent inline over the control socket
(location kind "m": slower, one more copy each side, but correct; budget.count_fallback counts
it). Nothing here can SIGBUS on a full /dev/shm.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import threading
from collections import deque
from typing import Any

import numpy as np

from oceanus.ipc import budget

# The tail word is read and written through a memoryview cast to "Q": one 8-byte copy, a single
# load or store on x86-64. Not "<Q" (struct copies it byte by byte) and not struct.pack_into at
# all (it zeroes the word before storing the value: the writer could read tail 0 meanwhile and
# spill a block to a one-off file for nothing; msgring.py had the same, worse, with its head).
RING_HEADER = 64
DEFAULT_RING_BYTES = 8 << 20

# Where a block is: ("r", offset in the ring's data, the ring position just past it),
# ("f", path of a one-off file, size) or ("m", the bytes themselves, size). A plain tuple: it
# travels inside marshal messages.
Location = tuple[Any, ...]


shm_dir = budget.shm_dir


def create_ring_file(path: str, capacity: int) -> None:
    """Create a ring file, its pages reserved (the process that starts the other one creates
    both directions); budget.ShmFull (nothing left behind) when /dev/shm cannot hold it."""
    budget.create_file(path, RING_HEADER + capacity)


_map = budget.map_file


class RingWriter:
    """The producing end of one ring; `spill_prefix` names one-off files for large messages."""

    def __init__(self, path: str, capacity: int, spill_prefix: str) -> None:
        self._mm = _map(path, RING_HEADER + capacity)
        self._bytes = np.frombuffer(self._mm, dtype=np.uint8)
        self._tail = memoryview(self._mm)[:8].cast("Q")
        self._capacity = capacity
        self._head = 0
        self._spill_prefix = spill_prefix
        self._spills = itertools.count()

    def place(self, size: int) -> tuple[Location, np.ndarray, mmap.mmap | None]:
        """Room for `size` bytes: its location, a writable uint8 view, and the one-off mapping
        to close after writing (None for the ring)."""
        capacity = self._capacity
        if size <= capacity:
            tail: int = self._tail[0]
            offset = self._head % capacity
            pad = capacity - offset if offset + size > capacity else 0
            if self._head + pad + size - tail <= capacity:
                start = self._head + pad
                self._head = start + size
                data_offset = start % capacity
                view = self._bytes[RING_HEADER + data_offset : RING_HEADER + data_offset + size]
                return ("r", data_offset, self._head), view, None
        path = f"{self._spill_prefix}{next(self._spills)}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, max(size, 1))
            budget.reserve(fd, max(size, 1))
            mapping = mmap.mmap(fd, max(size, 1))
        except budget.ShmFull:
            os.unlink(path)
            # No room in /dev/shm: the bytes travel inside the message itself (marshal
            # sends a bytearray as bytes).
            budget.count_fallback()
            inline = bytearray(size)
            return ("m", inline, size), np.frombuffer(inline, dtype=np.uint8), None
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        return ("f", path, size), np.frombuffer(mapping, dtype=np.uint8, count=size), mapping

    def close(self) -> None:
        self._tail.release()
        self._bytes = np.empty(0, dtype=np.uint8)
        # BufferError: a view still exists somewhere; the GC unmaps it later
        with contextlib.suppress(BufferError):
            self._mm.close()


class RingReader:
    """The consuming end of one ring."""

    def __init__(self, path: str, capacity: int) -> None:
        self._mm = _map(path, RING_HEADER + capacity)
        self._bytes = np.frombuffer(self._mm, dtype=np.uint8)
        self._tail = memoryview(self._mm)[:8].cast("Q")
        self._blocks: deque[list[Any]] = deque()
        self._lock = threading.Lock()

    def open(self, loc: Location) -> tuple[np.ndarray, list[Any] | None]:
        """The block's bytes (a uint8 array) and the token that releases it."""
        if loc[0] == "r":
            _, offset, end = loc
            token = [end, False]
            with self._lock:
                self._blocks.append(token)
            return self._bytes[RING_HEADER + offset :], token
        if loc[0] == "m":
            budget.count_fallback()  # counted where it is read too: see budget.count_fallback
            return np.frombuffer(bytearray(loc[1]), dtype=np.uint8), None
        _, path, size = loc
        mapping = _map(path, max(size, 1))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return np.frombuffer(mapping, dtype=np.uint8, count=size), None

    def release(self, token: list[Any] | None) -> None:
        if token is None:
            return
        with self._lock:
            token[1] = True
            end = None
            while self._blocks and self._blocks[0][1]:
                end = self._blocks.popleft()[0]
            if end is not None:
                self._tail[0] = end

    def close(self) -> None:
        self._tail.release()
        self._bytes = np.empty(0, dtype=np.uint8)
        with contextlib.suppress(BufferError):
            self._mm.close()
