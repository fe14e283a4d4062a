"""Messages between two processes over a connected stream socket, read by one thread or many.

A message is a tuple of plain values (str, int, float, bool, bytes, None, tuples, lists, dicts)
encoded with `marshal` (both ends run the same interpreter) and framed by a 4-byte length. Typed
messages are NamedTuples registered in a `MessageKinds`: on the wire each is its plain tuple,
whose last field, `kind`, tells the reader which NamedTuple to rebuild (one C call, no copy of
the fields), so typing a message costs next to nothing
(bench/investigations/ipc_messages.py measures it).
"""

from __future__ import annotations

import contextlib
import marshal
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from oceanus.ipc.rings import Location, RingWriter
from oceanus.ipc.tensors import TensorDesc, TensorItem, pack

LENGTH = struct.Struct("<I")
_new_tuple = tuple.__new__


def frame(message: tuple[Any, ...]) -> bytes:
    """One message as it travels: 4-byte little-endian length, then its marshal bytes. Both
    faces of a link (this threaded one, aio.py's asyncio one) frame with this."""
    # [:] is the plain tuple marshal wants (a NamedTuple is a subclass it refuses).
    data = marshal.dumps(message[:])
    return LENGTH.pack(len(data)) + data


class MessageKinds:
    """The typed messages one channel carries: NamedTuples whose last field is `kind: int`,
    defaulting to a number no other of them uses (so senders never write it)."""

    def __init__(self, classes: Iterable[type[tuple[Any, ...]]]) -> None:
        self.by_kind: dict[int, type[tuple[Any, ...]]] = {}
        for cls in classes:
            fields: tuple[str, ...] = getattr(cls, "_fields", ())
            kind = getattr(cls, "_field_defaults", {}).get("kind")
            if not fields or fields[-1] != "kind" or not isinstance(kind, int):
                raise TypeError(f"{cls.__name__} needs a last field `kind: int = <number>`")
            if kind in self.by_kind:
                raise ValueError(f"{cls.__name__} and {self.by_kind[kind].__name__}: kind {kind}")
            self.by_kind[kind] = cls

    def decode(self, plain: tuple[Any, ...]) -> Any:
        return _new_tuple(self.by_kind[plain[-1]], plain)


class Channel:
    """Length-framed marshal messages over a connected stream socket.

    With `kinds`, `recv` returns the typed message (plain tuples otherwise). `send` may be
    called from any thread; `recv` from one thread at a time (see Mailbox). Senders that place
    tensors in a ring hold `lock` from placing to sending, so blocks reach the reader in ring
    order.

    A message may be held (`send_tensors(..., hold=True)`) instead of sent: it leaves with the
    next message sent, at `flush()`, or before a thread of this end blocks waiting for the other
    one (`recv`, Mailbox.wait), whichever comes first. So a run of messages written without
    waiting in between crosses in one system call and wakes the other end once, and a held
    message can never wait for an answer that needs it."""

    def __init__(self, sock: socket.socket, kinds: MessageKinds | None = None) -> None:
        self.sock = sock
        self.lock = threading.Lock()
        self._classes = kinds.by_kind if kinds is not None else None
        self._buffer = bytearray()
        self._poll = select.poll()  # the socket and the wake fd
        self._poll.register(sock.fileno(), select.POLLIN)
        self._poll_socket = select.poll()
        self._poll_socket.register(sock.fileno(), select.POLLIN)
        self._wake_fd = -1
        self._held: list[bytes] = []  # frames not sent yet, in order (guarded by `lock`)

    def send(self, message: tuple[Any, ...]) -> None:
        data = frame(message)
        with self.lock:
            if self._held:
                data = self._take_held(data)
            self.sock.sendall(data)

    def send_locked(self, message: tuple[Any, ...]) -> None:
        """`send` for a caller already holding `lock`."""
        data = frame(message)
        if self._held:
            data = self._take_held(data)
        self.sock.sendall(data)

    def _take_held(self, data: bytes = b"") -> bytes:
        held = self._held
        held.append(data)
        data = b"".join(held)
        held.clear()
        return data

    @property
    def holding(self) -> bool:
        return bool(self._held)

    def flush(self) -> None:
        """Send the held messages now."""
        if self._held:
            with self.lock:
                if self._held:
                    self.sock.sendall(self._take_held())

    def send_tensors(
        self,
        writer: RingWriter,
        groups: Sequence[Sequence[TensorItem]],
        build: Callable[[Location | None, list[list[TensorDesc]]], tuple[Any, ...]],
        before_send: Callable[[], None] | None = None,
        hold: bool = False,
    ) -> None:
        """Place the groups' tensors in one block of `writer`'s ring, build the message from its
        location and the descriptors (one list per group), send it (`hold`: hold it)."""
        with self.lock:
            loc, descs = pack(writer, groups)
            if before_send is not None:
                before_send()
            if hold:
                self._held.append(frame(build(loc, descs)))
            else:
                self.send_locked(build(loc, descs))

    def watch(self, wake_fd: int) -> None:
        """Let `recv` also return (None) when `wake_fd` becomes readable."""
        self._wake_fd = wake_fd
        self._poll.register(wake_fd, select.POLLIN)

    def recv(self, timeout: float | None = None, wakeable: bool = False) -> Any:
        """The next message; None when `timeout` (seconds) passed first or, if `wakeable`, the
        wake fd fired. Raises EOFError when the other end closed."""
        buffer = self._buffer
        while True:
            message = self._buffered()
            if message is not None:
                return message
            if self._held:  # about to wait for the other end: what it may need goes first
                self.flush()
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

    def recv_ready(self) -> list[Any] | None:
        """The messages there without waiting: those already buffered whole and what one
        non-blocking read brings. None when the other end closed."""
        try:
            chunk: bytes | None = self.sock.recv(1 << 16, socket.MSG_DONTWAIT)
        except BlockingIOError:
            chunk = None
        except OSError:
            return None
        buffer = self._buffer
        if chunk is not None:
            if not chunk:
                return None
            buffer += chunk
        messages = []
        while (message := self._buffered()) is not None:
            messages.append(message)
        return messages

    def _buffered(self) -> Any:
        """The next message if the buffer holds it whole (typed with `kinds`), else None
        (messages are tuples, never None)."""
        buffer = self._buffer
        if len(buffer) < 4:
            return None
        (length,) = LENGTH.unpack_from(buffer, 0)
        if len(buffer) < 4 + length:
            return None
        message = marshal.loads(buffer[4 : 4 + length])  # one copy, not two
        del buffer[: 4 + length]
        classes = self._classes
        if classes is None:
            return message
        return _new_tuple(classes[message[-1]], message)

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
        dispatch: Callable[[Any], None],
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
            flush = False
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
                    # Another thread reads: what this one held goes before it sleeps (sent
                    # outside the condition, which the reading thread needs to dispatch).
                    flush = self.channel.holding
                    if flush:
                        break
                    self.cond.wait(remaining)
            if flush:
                with contextlib.suppress(OSError):  # closed: the reading thread sees it
                    self.channel.flush()
                continue
            self._read_one(remaining, wakeable)

    def read_ready(self) -> bool:
        """Read and dispatch what is there without waiting, for a reader an event loop drives
        (`add_reader`); nothing while another thread reads (it dispatches). False once the
        channel is closed."""
        with self.cond:
            if self.closed:
                return False
            if self._reading:
                return True
            self._reading = True
        messages = None
        try:
            messages = self.channel.recv_ready()
        finally:
            with self.cond:
                self._reading = False
                self._last_read = time.monotonic()
                try:
                    if messages is None:
                        self.closed = True
                    else:
                        for message in messages:
                            self._dispatch(message)
                finally:
                    self.cond.notify_all()
        if messages is None:
            self._on_eof()
            return False
        return True

    def standby(self) -> None:
        """The standby reader's loop (its own thread), until the channel closes.

        With a threshold it naps on its own event instead of the mailbox's condition, so the
        dispatch of every message does not wake it too."""
        while True:
            with self.cond:
                if self.closed:
                    return
                idle = time.monotonic() - self._last_read
                other = self._reading  # another thread reads (blocked until a message comes)
                take = not other and idle >= self._standby_after
                if take:
                    self._reading = True
                elif self._standby_after <= 0:
                    self.cond.wait()
                    continue
            if take:
                self._read_one(None)
            elif other:
                # Nap a whole threshold: counting from its last read, a quiet channel read by a
                # blocked thread had this thread wake every millisecond (1,000 wake-ups a second
                # per idle stub and per idle instance, seen with strace).
                self._nap.wait(self._standby_after)
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
