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

A ring may grow (`growth` > 0, Triton's `shm-growth-byte-size`): the writer is the side that
learns a message does not fit, so the writer grows. It creates a new, larger segment (reserved
like the first), moves to it, and places the message at its start with the location
("g", path, capacity, offset, end): the first block of a new segment names the segment. Every
later block is an ordinary ("r", ...) of the newest segment. Locations reach the reader in the
order they were placed (the writer places and sends under the channel's lock) and the reader
opens them in that order (each process opens a message's block when the message is dispatched),
so the reader maps the new segment, unlinks its name, and from then on reads "r" blocks there.
Blocks of the old segment still in use keep it mapped (their release tokens and views hold it);
once the last is released and dropped, it is unmapped and its pages go back to /dev/shm. No
message ever waits for the peer to remap, and the old segment is never written again. A segment
that cannot be reserved leaves the ring as it was: the message takes the one-off file or inline
path, and growth is not tried again for GROWTH_RETRY_S.

A grown ring shrinks back the same way: the writer keeps the most bytes in use (placed and not
yet released, the new block included) over SHRINK_AFTER_S; when a window ends with that peak
needing fewer growth steps than the ring has, the next message moves to a segment of that size
(the size at start, at least). So a burst's rings go back after a quiet spell, on the next
message; a ring nobody writes to keeps its size.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from oceanus.ipc import budget

# The tail word is read and written through a memoryview cast to "Q": one 8-byte copy, a single
# load or store on x86-64. Not "<Q" (struct copies it byte by byte) and not struct.pack_into at
# all (it zeroes the word before storing the value: the writer could read tail 0 meanwhile and
# spill a block to a one-off file for nothing; msgring.py had the same, worse, with its head).
RING_HEADER = 64
DEFAULT_RING_BYTES = 8 << 20
# After a growth that /dev/shm could not hold, how long messages that do not fit take the one-off
# path without trying again (a failing posix_fallocate of megabytes is not free).
GROWTH_RETRY_S = 1.0
# A grown ring is sized down to what the most bytes it held at once in this long needed.
SHRINK_AFTER_S = 30.0

# Where a block is: ("r", offset in the ring's data, the ring position just past it),
# ("g", path of a new segment, its capacity, offset, position past it: the ring grew, see above),
# ("f", path of a one-off file, size) or ("m", the bytes themselves, size). A plain tuple: it
# travels inside marshal messages.
Location = tuple[Any, ...]


shm_dir = budget.shm_dir


def create_ring_file(path: str, capacity: int) -> None:
    """Create a ring file, its pages reserved (the process that starts the other one creates
    both directions); budget.ShmFull (nothing left behind) when /dev/shm cannot hold it."""
    budget.create_file(path, RING_HEADER + capacity)


_map = budget.map_file


def grown_capacity(capacity: int, size: int, growth: int) -> int:
    """The capacity after growing by whole `growth` steps (at least one) to hold `size`."""
    steps = max(1, -(-(size - capacity) // growth))
    return capacity + steps * growth


class _Segment:
    """One mapped ring file: its bytes and its tail word (the reader's released position)."""

    __slots__ = ("bytes", "capacity", "mm", "tail")

    def __init__(self, path: str, capacity: int) -> None:
        self.mm = _map(path, RING_HEADER + capacity)
        self.bytes = np.frombuffer(self.mm, dtype=np.uint8)
        self.tail = memoryview(self.mm)[:8].cast("Q")
        self.capacity = capacity

    def close(self) -> None:
        self.tail.release()
        self.bytes = np.empty(0, dtype=np.uint8)
        # BufferError: a view still exists somewhere; the GC unmaps it later
        with contextlib.suppress(BufferError):
            self.mm.close()


class RingWriter:
    """The producing end of one ring; `spill_prefix` names one-off files for large messages and
    the ring's new segments. `growth` > 0: a message that does not fit grows the ring by whole
    steps of that many bytes, and shrinks back after `shrink_after_s` without needing them (see
    above); `on_grow(capacity)` is told each new size."""

    def __init__(
        self,
        path: str,
        capacity: int,
        spill_prefix: str,
        growth: int = 0,
        on_grow: Callable[[int], None] | None = None,
        shrink_after_s: float = SHRINK_AFTER_S,
    ) -> None:
        self._segment = _Segment(path, capacity)
        self._bytes = self._segment.bytes
        self._tail = self._segment.tail
        self._capacity = capacity
        self._head = 0
        self._spill_prefix = spill_prefix
        self._spills = itertools.count()
        self._growth = growth
        self.on_grow = on_grow
        self._retry_growth_at = 0.0
        self._initial = capacity
        self._shrink_after = shrink_after_s
        self._peak = 0  # the most bytes in use at once since the window began (grown rings)
        self._window_end = 0.0

    @property
    def capacity(self) -> int:
        return self._capacity

    def place(self, size: int) -> tuple[Location, np.ndarray, mmap.mmap | None]:
        """Room for `size` bytes: its location, a writable uint8 view, and the one-off mapping
        to close after writing (None for the ring)."""
        capacity = self._capacity
        if capacity > self._initial:
            shrunk = self._shrink(size)
            if shrunk is not None:
                return shrunk
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
        if self._growth > 0 and time.monotonic() >= self._retry_growth_at:
            moved = self._move(grown_capacity(capacity, size, self._growth), size)
            if moved is not None:
                return moved
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

    def _shrink(self, size: int) -> tuple[Location, np.ndarray, None] | None:
        """A grown ring: count what is in use with this block; at the end of a window whose peak
        needs a smaller ring, place the block at the start of one."""
        in_use = self._head - self._tail[0] + size
        if in_use > self._peak:
            self._peak = in_use
        if time.monotonic() < self._window_end:
            return None
        initial = self._initial
        peak, self._peak = self._peak, 0
        self._window_end = time.monotonic() + self._shrink_after
        target = initial if peak <= initial else grown_capacity(initial, peak, self._growth)
        if target >= self._capacity:
            return None
        return self._move(target, size)

    def _move(self, capacity: int, size: int) -> tuple[Location, np.ndarray, None] | None:
        """Move to a new segment of `capacity` bytes and place `size` bytes at its start (None:
        /dev/shm has no room for it, the ring stays as it was)."""
        path = f"{self._spill_prefix}g{next(self._spills)}"
        try:
            create_ring_file(path, capacity)
            segment = _Segment(path, capacity)
        except budget.ShmFull:
            self._retry_growth_at = time.monotonic() + GROWTH_RETRY_S
            return None
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            raise
        # Nothing of the old segment is written any more (every block placed in it was written
        # before its message was sent); the reader keeps its own mapping while it needs one.
        self._segment.close()
        self._segment = segment
        self._bytes, self._tail, self._capacity = segment.bytes, segment.tail, capacity
        self._head = size
        self._peak = size
        self._window_end = time.monotonic() + self._shrink_after
        if self.on_grow is not None:
            self.on_grow(capacity)
        view = self._bytes[RING_HEADER : RING_HEADER + size]
        return ("g", path, capacity, 0, size), view, None

    def close(self) -> None:
        self._bytes = np.empty(0, dtype=np.uint8)
        self._segment.close()


class RingReader:
    """The consuming end of one ring. Blocks must be opened in the order they were placed (the
    order their messages arrive); `on_grow(capacity)` is told when the writer grew the ring."""

    def __init__(
        self, path: str, capacity: int, on_grow: Callable[[int], None] | None = None
    ) -> None:
        self._segment = _Segment(path, capacity)
        # (position past the block, released, its segment), in the order opened
        self._blocks: deque[list[Any]] = deque()
        self._lock = threading.Lock()
        self.on_grow = on_grow

    @property
    def capacity(self) -> int:
        return self._segment.capacity

    def open(self, loc: Location) -> tuple[np.ndarray, list[Any] | None]:
        """The block's bytes (a uint8 array) and the token that releases it."""
        kind = loc[0]
        if kind == "r":
            _, offset, end = loc
        elif kind == "g":
            _, path, capacity, offset, end = loc
            segment = _Segment(path, capacity)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # both ends have it mapped: the name is not needed any more
            with self._lock:
                self._segment = segment  # the old one lives on in its blocks' tokens
            if self.on_grow is not None:
                self.on_grow(capacity)
        elif kind == "m":
            budget.count_fallback()  # counted where it is read too: see budget.count_fallback
            return np.frombuffer(bytearray(loc[1]), dtype=np.uint8), None
        else:
            _, path, size = loc
            mapping = _map(path, max(size, 1))
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return np.frombuffer(mapping, dtype=np.uint8, count=size), None
        segment = self._segment
        token = [end, False, segment]
        with self._lock:
            self._blocks.append(token)
        return segment.bytes[RING_HEADER + offset :], token

    def release(self, token: list[Any] | None) -> None:
        if token is None:
            return
        with self._lock:
            token[1] = True
            last = None
            while self._blocks and self._blocks[0][1]:
                last = self._blocks.popleft()
                # An old segment's tail is written too: harmless, nobody writes there any more.
                last[2].tail[0] = last[0]
                last[2] = None  # an old segment goes once its views are gone

    def close(self) -> None:
        self._segment.close()
