"""Messages themselves in shared memory: a byte ring per direction, and the sleep handshake that
lets a writer skip the system call (and the reader's wake-up) while the reader is awake.

A ring is a file in /dev/shm mapped by both processes:

    0    head: bytes ever written (u64, the writer's)
    64   tail: bytes ever consumed (u64, the reader's)
    128  asleep: 0 while the reader polls; otherwise the number of the sleep it is going into
    192  data: records (a frame as channel.frame makes it: 4-byte length + marshal bytes),
         never split at the end (PAD fills the rest), SOCKET marks "the next frame is on the
         socket" (frames bigger than a quarter of the ring travel there, in ring order)

The doorbell is on the socket the two ends share anyway: an empty frame (aio.py). A writer
writes one only when the reader has said it is going to sleep (`asleep` set to a sleep it has
not rung for yet): while the reader's loop runs, a message costs no system call on either side.

**The sleep handshake.** The reader arms (`asleep` = n), then looks at `head` once more; the
writer publishes `head`, then reads `asleep`. On x86 a store may be passed by a later load of
another address (the store sits in the store buffer), so without a fence both could read the
other's old value: the reader sleeps on a message the writer saw no sleeper for (a lost
wake-up). Python has no fence, so both sides take and release an uncontended `threading.Lock`
between their store and their load: CPython's lock is a glibc semaphore whose fast path is a
`lock cmpxchg`, a full barrier on x86 (about 0.1 µs). Then at least one side sees the other's
store: the reader finds the message, or the writer rings. A doorbell rung for a sleep the reader
has already left wakes it for nothing, which is harmless. Data before head: x86 keeps stores in
order and loads in order, and Python writes both with plain copies.
"""

from __future__ import annotations

import contextlib
import mmap
import struct
import threading
from collections.abc import Callable
from typing import Any

from oceanus.ipc import budget

# The shared words are read and written through a memoryview cast to "Q": one 8-byte copy, a
# single load or store on x86-64. Never with struct.pack_into: it zeroes its target before it
# writes the value (memset, then the store), so the other process could read 0 in between: a
# reader that saw head 0 read far past the real head (stale records, "bad marshal data"). The
# file is created with them 0, so _U64 still serves `create`.
_U64 = struct.Struct("Q")
_U32 = struct.Struct("<I")
HEAD, TAIL, ASLEEP = 0, 64, 128
_HEAD, _TAIL, _ASLEEP = HEAD // 8, TAIL // 8, ASLEEP // 8  # indexes of the "Q" view
HEADER = 192
PAD = 0xFFFFFFFF
SOCKET = 0xFFFFFFFE
DEFAULT_BYTES = 256 << 10

_fence_lock = threading.Lock()


def fence() -> None:
    """A full memory barrier (see the module's docstring)."""
    _fence_lock.acquire()
    _fence_lock.release()


def create(path: str, capacity: int) -> None:
    """A ring file, pages reserved, its reader marked asleep (so the first message rings);
    budget.ShmFull (nothing left behind) when /dev/shm cannot hold it."""
    budget.create_file(path, HEADER + capacity, (ASLEEP, _U64.pack(1)))


_map = budget.map_file


class RingCorrupt(Exception):
    """The ring's words or a record's length make no sense: says where, and the bytes there."""

    def __init__(self, what: str, mm: mmap.mmap, head: int, tail: int, capacity: int) -> None:
        offset = tail % capacity
        around = bytes(mm[HEADER + max(0, offset - 32) : HEADER + min(capacity, offset + 64)])
        super().__init__(
            f"message ring corrupt: {what} (head {head}, tail {tail}, offset {offset}, "
            f"capacity {capacity}; bytes from offset {max(0, offset - 32)}: {around.hex()})"
        )


class MsgRingWriter:
    def __init__(self, path: str) -> None:
        self._mm = _map(path)
        self._words = memoryview(self._mm)[:HEADER].cast("Q")
        self._capacity = len(self._mm) - HEADER
        self.max_record = self._capacity // 4
        self._head: int = self._words[_HEAD]
        self._tail = 0  # the reader's tail as last read: re-read only when short of room
        self._rung = 0  # the last sleep a doorbell was rung for

    def _room(self, size: int) -> int:
        """Bytes to skip before a record of `size` (0 or PAD's extent), or -1: no room now."""
        offset = self._head % self._capacity
        pad = self._capacity - offset if offset + size > self._capacity else 0
        if self._head + pad + size - self._tail > self._capacity:
            self._tail = self._words[_TAIL]
            if self._head + pad + size - self._tail > self._capacity:
                return -1
        return pad

    def _put(self, record: bytes | memoryview, size: int) -> bool:
        pad = self._room(size)
        if pad < 0:
            return False
        mm = self._mm
        if pad:
            if pad >= 4:
                _U32.pack_into(mm, HEADER + self._head % self._capacity, PAD)
            self._head += pad
        start = HEADER + self._head % self._capacity
        mm[start : start + size] = record
        self._head += size
        self._words[_HEAD] = self._head
        return True

    def put(self, frame: bytes) -> bool:
        """Append one frame; False when it is too big for the ring or there is no room now."""
        return len(frame) <= self.max_record and self._put(frame, len(frame))

    def put_socket_marker(self) -> bool:
        """Say that the next frame travels on the socket; False when there is no room now."""
        return self._put(_U32.pack(SOCKET), 4)

    def wants_doorbell(self) -> bool:
        """Whether the reader went to sleep since the last doorbell (call after `put`s)."""
        fence()
        asleep = self._words[_ASLEEP]
        if asleep and asleep != self._rung:
            self._rung = asleep
            return True
        return False

    def close(self) -> None:
        self._words.release()
        with contextlib.suppress(BufferError):
            self._mm.close()


class MsgRingReader:
    def __init__(self, path: str) -> None:
        self._mm = _map(path)
        self._view = memoryview(self._mm)
        self._words = self._view[:HEADER].cast("Q")
        self._capacity = len(self._mm) - HEADER
        self._tail: int = self._words[_TAIL]
        self._sleeps = 1  # the creator's mark is sleep 1
        self.armed = True

    def pending(self) -> bool:
        return bool(self._words[_HEAD] != self._tail)

    def read(self, on_frame: Callable[[Any], None], socket_frames: list[bytes]) -> int:
        """Hand every record there is to `on_frame` (a memoryview of its marshal bytes, or for a
        SOCKET mark the next of `socket_frames`, taken from it); stops early at a SOCKET mark
        whose frame has not arrived. Returns how many it handed. RingCorrupt when the head or a
        record's length cannot be right (then the link is of no use: its owner closes it)."""
        mm, view, capacity = self._mm, self._view, self._capacity
        head: int = self._words[_HEAD]
        tail = self._tail
        if not 0 <= head - tail <= capacity:
            raise RingCorrupt("head behind tail or a lap ahead", mm, head, tail, capacity)
        count = 0
        try:
            while tail != head:
                offset = tail % capacity
                if capacity - offset < 4:
                    tail += capacity - offset
                    continue
                (length,) = _U32.unpack_from(mm, HEADER + offset)
                if length == PAD:
                    tail += capacity - offset
                    continue
                if length == SOCKET:
                    if not socket_frames:
                        break
                    tail += 4
                    count += 1
                    on_frame(socket_frames.pop(0))
                    continue
                if 4 + length > head - tail or 4 + length > capacity - offset:
                    raise RingCorrupt(f"record length {length}", mm, head, tail, capacity)
                start = HEADER + offset + 4
                tail += 4 + length
                count += 1
                on_frame(view[start : start + length])
        finally:
            if tail != self._tail:
                self._tail = tail
                self._words[_TAIL] = tail
        return count

    def arm(self) -> bool:
        """Say this reader is going to sleep; True when a record came meanwhile (then it stays
        awake: `disarm` and read)."""
        self._sleeps += 1
        self._words[_ASLEEP] = self._sleeps
        self.armed = True
        fence()
        return self.pending()

    def disarm(self) -> None:
        self._words[_ASLEEP] = 0
        self.armed = False

    def close(self) -> None:
        self._words.release()
        self._view.release()
        with contextlib.suppress(BufferError):
            self._mm.close()
