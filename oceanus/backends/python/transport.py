"""How the server and a Python worker talk: small control messages over a socketpair, tensor
bytes through shared memory.

Control messages are the typed structures of messages.py, sent as tuples of plain values (str,
int, float, bool, bytes, None, tuples, lists, dicts) encoded with `marshal` (both ends run the
same interpreter) and framed by a 4-byte length. They carry names, datatypes, shapes and offsets,
never tensor data.

Tensor bytes travel through two single-producer rings, one per direction, each a file in /dev/shm
mapped by both processes. The writer places the tensors of one message in one contiguous block
and sends the block's location with the message; the reader views (or copies) the arrays in place
and, once done with the block, advances the ring's tail (a 64-bit counter in the ring's header)
so the writer may reuse the space. Blocks are released in the order they were received; a block
released early waits for the blocks before it. A message that does not fit in the free part of
the ring goes through a one-off file that the reader unlinks as soon as it has mapped it, so a
full ring never blocks a writer (which could otherwise deadlock with a reader waiting on it).
"""

from __future__ import annotations

import contextlib
import itertools
import marshal
import mmap
import os
import select
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from oceanus.backends.python.messages import Message, decode, encode
from oceanus.core import datatypes
from oceanus.core.tensor_bytes import bytes_elements

_LENGTH = struct.Struct("<I")
_TAIL = struct.Struct("<Q")
RING_HEADER = 64
ALIGN = 64
DEFAULT_RING_BYTES = 8 << 20

# Wire datatype names -> numpy dtypes (BYTES travel length-framed; BF16 resolved lazily).
_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}


def numpy_dtype(datatype: str) -> np.dtype:
    """The numpy dtype of a wire datatype name (object for BYTES)."""
    found = _DTYPES.get(datatype)
    if found is not None:
        return found
    if datatype == "BYTES":
        return np.dtype(object)
    if datatype == "BF16":
        try:
            import ml_dtypes

            found = np.dtype(ml_dtypes.bfloat16)
        except ImportError:  # pragma: no cover - ml_dtypes comes with onnx
            found = np.dtype(np.uint16)
        _DTYPES["BF16"] = found
        return found
    raise ValueError(f"unknown datatype '{datatype}'")


# ---- shared-memory rings ----------------------------------------------------------------------


def shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else os.environ.get("TMPDIR", "/tmp")


def create_ring_file(path: str, capacity: int) -> None:
    """Create a ring file (the server does, for both directions)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, RING_HEADER + capacity)
    finally:
        os.close(fd)


def _map(path: str, size: int) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


Location = tuple[Any, ...]  # ("r", data offset, end position) or ("f", path, size)


class RingWriter:
    """The producing end of one ring; `spill_prefix` names one-off files for large messages."""

    def __init__(self, path: str, capacity: int, spill_prefix: str) -> None:
        self._mm = _map(path, RING_HEADER + capacity)
        self._bytes = np.frombuffer(self._mm, dtype=np.uint8)
        self._capacity = capacity
        self._head = 0
        self._spill_prefix = spill_prefix
        self._spills = itertools.count()

    def place(self, size: int) -> tuple[Location, np.ndarray, mmap.mmap | None]:
        """Room for `size` bytes: its location, a writable uint8 view, and the one-off mapping
        to close after writing (None for the ring)."""
        capacity = self._capacity
        if size <= capacity:
            (tail,) = _TAIL.unpack_from(self._mm, 0)
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
            mapping = mmap.mmap(fd, max(size, 1))
        finally:
            os.close(fd)
        return ("f", path, size), np.frombuffer(mapping, dtype=np.uint8, count=size), mapping

    def close(self) -> None:
        self._bytes = np.empty(0, dtype=np.uint8)
        # BufferError: a view still exists somewhere; the GC unmaps it later
        with contextlib.suppress(BufferError):
            self._mm.close()


class RingReader:
    """The consuming end of one ring."""

    def __init__(self, path: str, capacity: int) -> None:
        self._mm = _map(path, RING_HEADER + capacity)
        self._bytes = np.frombuffer(self._mm, dtype=np.uint8)
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
                _TAIL.pack_into(self._mm, 0, end)

    def close(self) -> None:
        self._bytes = np.empty(0, dtype=np.uint8)
        with contextlib.suppress(BufferError):
            self._mm.close()


# ---- tensors in blocks ------------------------------------------------------------------------

TensorItem = tuple[str, str, np.ndarray]  # (name, datatype, array)
TensorDesc = tuple[str, str, tuple[int, ...], int, int]  # (name, datatype, shape, offset, nbytes)


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


# ---- the control channel -------------------------------------------------------------------------


class Channel:
    """Length-framed marshal messages over a connected stream socket.

    `send` may be called from any thread; `recv` from one thread at a time (see Mailbox).
    Senders that place tensors in a ring hold `lock` from placing to sending, so blocks reach
    the reader in ring order."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.lock = threading.Lock()
        self._buffer = bytearray()
        self._poll = select.poll()  # the socket and the wake fd
        self._poll.register(sock.fileno(), select.POLLIN)
        self._poll_socket = select.poll()
        self._poll_socket.register(sock.fileno(), select.POLLIN)
        self._wake_fd = -1

    def send(self, message: Message) -> None:
        data = marshal.dumps(encode(message))
        with self.lock:
            self.sock.sendall(_LENGTH.pack(len(data)) + data)

    def send_locked(self, message: Message) -> None:
        """`send` for a caller already holding `lock`."""
        data = marshal.dumps(encode(message))
        self.sock.sendall(_LENGTH.pack(len(data)) + data)

    def send_tensors(
        self,
        writer: RingWriter,
        groups: Sequence[Sequence[TensorItem]],
        build: Callable[[Location | None, list[list[TensorDesc]]], Message],
        before_send: Callable[[], None] | None = None,
    ) -> None:
        """Place the tensors, build the message from their location and descriptors, send."""
        with self.lock:
            loc, descs = pack(writer, groups)
            if before_send is not None:
                before_send()
            self.send_locked(build(loc, descs))

    def watch(self, wake_fd: int) -> None:
        """Let `recv` also return (None) when `wake_fd` becomes readable."""
        self._wake_fd = wake_fd
        self._poll.register(wake_fd, select.POLLIN)

    def recv(self, timeout: float | None = None, wakeable: bool = False) -> Message | None:
        """The next message; None when `timeout` (seconds) passed first or, if `wakeable`, the
        wake fd fired. Raises EOFError when the other end closed."""
        buffer = self._buffer
        while True:
            if len(buffer) >= 4:
                (length,) = _LENGTH.unpack_from(buffer, 0)
                if len(buffer) >= 4 + length:
                    data = bytes(buffer[4 : 4 + length])
                    del buffer[: 4 + length]
                    return decode(marshal.loads(data))
            if timeout is not None or (wakeable and self._wake_fd >= 0):
                poll = self._poll if wakeable else self._poll_socket
                events = poll.poll(None if timeout is None else max(0, timeout * 1000))
                if not events:
                    return None
                if any(fd == self._wake_fd for fd, _ in events):
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_fd, 4096)
                    return None
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise EOFError("channel closed")
            buffer += chunk

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class Mailbox:
    """Reading one channel from several threads without handing every message over.

    A thread that waits for something (`wait(done)`) reads the socket itself while no other
    thread does, and dispatches what it reads (for itself or for others) under the mailbox's
    condition, then rechecks. So the thread that waits for a batch's result usually reads that
    result itself: no thread switch between reading and using it. A standby thread reads the
    messages nobody waits for (log lines, BLS calls from a model's own threads, responses of
    decoupled models), taking over once nobody has read for `standby_after_s`.

    `poke()` wakes the waiters for a change that is not a message (a coroutine finished)."""

    def __init__(
        self,
        channel: Channel,
        dispatch: Callable[[Message], None],
        on_eof: Callable[[], None],
        standby_after_s: float,
    ) -> None:
        self.channel = channel
        self._dispatch = dispatch
        self._on_eof = on_eof
        self._standby_after = standby_after_s
        self.cond = threading.Condition()
        self._reading = False
        self.closed = False
        self._last_read = time.monotonic()
        self._nap = threading.Event()  # set only at close
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        channel.watch(self._wake_read)

    def wait(
        self, done: Callable[[], bool], timeout: float | None = None, wakeable: bool = False
    ) -> bool:
        """Until done() (True) or the timeout (False); reads the channel when nobody else is.

        `wakeable`: done() may turn true without a message (whoever makes it so calls poke()),
        so reading must be interruptible (one more system call per message)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self.cond:
                while True:
                    if done():
                        return True
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return False
                    if not self._reading and not self.closed:
                        self._reading = True
                        break
                    self.cond.wait(remaining)
            self._read_one(remaining, wakeable)

    def standby(self) -> None:
        """The standby reader's loop (its own thread), until the channel closes.

        With a threshold it naps on its own event instead of the mailbox's condition, so the
        dispatch of every message does not wake it too."""
        while True:
            with self.cond:
                if self.closed:
                    return
                idle = time.monotonic() - self._last_read
                take = not self._reading and idle >= self._standby_after
                if take:
                    self._reading = True
                elif self._standby_after <= 0:
                    self.cond.wait()
                    continue
            if take:
                self._read_one(None)
            else:
                self._nap.wait(max(self._standby_after - idle, 0.001))

    def _read_one(self, timeout: float | None, wakeable: bool = False) -> None:
        message = None
        eof = False
        try:
            message = self.channel.recv(timeout, wakeable)
        except (EOFError, OSError):
            eof = True
        with self.cond:
            self._reading = False
            self._last_read = time.monotonic()
            try:
                if eof:
                    self.closed = True
                elif message is not None:
                    self._dispatch(message)
            finally:
                self.cond.notify_all()
        if eof:
            self._on_eof()

    def poke(self) -> None:
        with self.cond:
            self.cond.notify_all()
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_write, b"\0")

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self._nap.set()
        self.poke()

    def dispose(self) -> None:
        """Close the wake-up pipe: only once no thread can be polling it any more (its numbers
        could be reused by another file while a stale poll still watched them)."""
        for fd in (self._wake_read, self._wake_write):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._wake_read = self._wake_write = -1

    def __del__(self) -> None:
        if self._wake_read >= 0:
            self.dispose()
