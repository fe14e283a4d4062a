"""The asyncio face of a channel (channel.py is the threaded one): the same frames, the same
typed messages (`MessageKinds`), read by a protocol on the event loop.

Without rings, every frame crosses the socket: `send` only appends to a buffer, and one callback
per loop iteration writes everything buffered with a single `transport.write`. With a message
ring per direction (msgring.py), frames go into shared memory and the socket carries only
doorbells (empty frames) and the rare frame too big for the ring: the writer rings only when the
reader said it is going to sleep. The reader reads its ring on a doorbell and, after each
message, keeps reading it once per loop iteration for `spin_ns` more (so while messages keep
coming nobody writes or waits on a socket); then it arms and stops until the next doorbell.
An asyncio loop has no "about to sleep" hook: the poll is a callback re-scheduled with
`call_soon`, so while it runs the loop does not block (the spin costs CPU, bounded by spin_ns).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import marshal
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from oceanus.ipc.channel import LENGTH, MessageKinds
from oceanus.ipc.msgring import MsgRingReader, MsgRingWriter, RingCorrupt

log = logging.getLogger("oceanus.ipc")
_new_tuple = tuple.__new__
_DOORBELL = LENGTH.pack(0)
_pack_length = LENGTH.pack
# How long a reader keeps polling its ring after the last message before it arms and sleeps
# (OCEANUS_LINK_SPIN_US; bench/workers.py measured the default: docs/architecture.md).
SPIN_NS = int(os.environ.get("OCEANUS_LINK_SPIN_US", "50")) * 1000
# While a writer holds frames the ring had no room for, it retries this often.
_RETRY_S = 0.001


class AioChannel(asyncio.Protocol):
    """One end of a link on an asyncio loop; `on_message` gets each typed message in order."""

    def __init__(
        self,
        kinds: MessageKinds,
        on_message: Callable[[Any], None],
        on_lost: Callable[[], None],
        rings: tuple[MsgRingWriter, MsgRingReader] | None = None,
    ) -> None:
        self._classes = kinds.by_kind
        self._out: MsgRingWriter | None = rings[0] if rings is not None else None
        self._in: MsgRingReader | None = rings[1] if rings is not None else None
        self._backlog: collections.deque[bytes] = collections.deque()
        self._socket_frames: list[bytes] = []
        self._polling = False
        self._last_message_ns = 0
        self.doorbells = 0  # rung by this end
        self.wakeups = 0  # doorbells that found this end asleep
        self._on_message = on_message
        self._on_lost = on_lost
        self._transport: Any = None  # an asyncio or uvloop transport
        self._outgoing: list[bytes] = []
        self._flush_scheduled = False
        self._incoming = bytearray()
        self._needed = 4
        self._loop = asyncio.get_running_loop()
        self.closed = False

    @classmethod
    async def open(
        cls,
        sock: socket.socket,
        kinds: MessageKinds,
        on_message: Callable[[Any], None],
        on_lost: Callable[[], None],
        rings: tuple[MsgRingWriter, MsgRingReader] | None = None,
    ) -> AioChannel:
        loop = asyncio.get_running_loop()
        _, channel = await loop.create_unix_connection(
            lambda: cls(kinds, on_message, on_lost, rings), sock=sock
        )
        # What the other end wrote before this one listened; unless a doorbell already started
        # the poll (two chains would both poll: harmless on one loop, but CPU for nothing).
        if rings is not None and not channel._polling:
            channel._polling = True
            loop.call_soon(channel._poll)
        return channel

    # ---- sending ----------------------------------------------------------------------------

    def send(self, message: tuple[Any, ...]) -> None:
        if self.closed:
            return
        # channel.frame, inlined: this runs once per message.
        data = marshal.dumps(message[:])
        data = _pack_length(len(data)) + data
        out = self._out
        if out is None:
            self._outgoing.append(data)
        elif self._backlog or not out.put(data):
            self._backlog.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._transport is None:
            return
        out = self._out
        if out is not None:
            backlog = self._backlog
            while backlog:
                data = backlog[0]
                if len(data) > out.max_record:
                    if not out.put_socket_marker():
                        break
                    self._outgoing.append(data)
                elif not out.put(data):
                    break
                backlog.popleft()
            if out.wants_doorbell():
                self._outgoing.append(_DOORBELL)
                self.doorbells += 1
            if backlog:  # the ring is full: the reader is behind, and will make room
                self._flush_scheduled = True
                self._loop.call_later(_RETRY_S, self._flush)
        if self._outgoing:
            data = b"".join(self._outgoing)
            self._outgoing.clear()
            self._transport.write(data)

    # ---- receiving --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        if self._incoming:
            self._incoming += data
            if len(self._incoming) < self._needed:
                return  # a big frame still arriving: no copy until it is whole
            data = bytes(self._incoming)
        offset, end = 0, len(data)
        on_message = self._on_message
        classes = self._classes
        unpack_from = LENGTH.unpack_from
        ring = self._in is not None
        view = memoryview(data)
        try:
            while end - offset >= 4:
                (length,) = unpack_from(data, offset)
                if end - offset - 4 < length:
                    break
                if ring:  # a doorbell, or a frame too big for the ring
                    if length:
                        self._socket_frames.append(bytes(view[offset + 4 : offset + 4 + length]))
                    offset += 4 + length
                    continue
                plain = marshal.loads(view[offset + 4 : offset + 4 + length])
                offset += 4 + length
                on_message(_new_tuple(classes[plain[-1]], plain))
        finally:
            rest = end - offset
            self._incoming = bytearray(view[offset:]) if rest else bytearray()
            # The bytes the first incomplete frame needs before it is worth decoding.
            self._needed = 4 + LENGTH.unpack_from(data, offset)[0] if rest >= 4 else 4
            view.release()
        if self._in is not None and not self._polling:
            self.wakeups += 1
            self._poll()

    def _on_frame(self, data: Any) -> None:
        try:
            plain = marshal.loads(data)
            self._on_message(_new_tuple(self._classes[plain[-1]], plain))
        except Exception:  # one bad message must not stop the ring's reader
            log.exception("a message on the link failed")

    def _poll(self) -> None:
        """Read the ring; keep polling once per loop iteration until `SPIN_NS` passed without a
        message, then arm (and read once more if a message came meanwhile)."""
        reader = self._in
        if reader is None or self.closed:
            self._polling = False
            return
        if reader.armed:
            reader.disarm()
        now = time.monotonic_ns()
        try:
            got = reader.read(self._on_frame, self._socket_frames)
        except RingCorrupt:  # nothing more on this link can be trusted: the other end restarts
            log.exception("the link's message ring is corrupt: closing the link")
            self._polling = False
            self._in = None
            if self._transport is not None:
                self._transport.close()
            return
        if got:
            self._last_message_ns = now
        elif now - self._last_message_ns >= SPIN_NS and reader.arm():
            reader.disarm()  # a message came as it armed: read it next turn
        elif reader.armed:
            self._polling = False
            return
        self._polling = True
        self._loop.call_soon(self._poll)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._transport = None
        self._on_lost()

    def close(self) -> None:
        self._flush()
        self._in = None
        if self._transport is not None:
            self._transport.close()
