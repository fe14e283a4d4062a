"""The asyncio face of a channel (channel.py is the threaded one): the same frames, the same
typed messages (`MessageKinds`), read by a protocol on the event loop.

Under load many messages travel per wake-up both ways: `send` only appends to a buffer, and one
callback per loop iteration writes everything buffered with a single `transport.write`;
`data_received` decodes every complete frame it got before returning.
"""

from __future__ import annotations

import asyncio
import marshal
import socket
from collections.abc import Callable
from typing import Any

from oceanus.ipc.channel import LENGTH, MessageKinds, frame

_new_tuple = tuple.__new__


class AioChannel(asyncio.Protocol):
    """One end of a link on an asyncio loop; `on_message` gets each typed message in order."""

    def __init__(
        self, kinds: MessageKinds, on_message: Callable[[Any], None], on_lost: Callable[[], None]
    ) -> None:
        self._classes = kinds.by_kind
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
    ) -> AioChannel:
        loop = asyncio.get_running_loop()
        _, channel = await loop.create_unix_connection(
            lambda: cls(kinds, on_message, on_lost), sock=sock
        )
        return channel

    # ---- sending ----------------------------------------------------------------------------

    def send(self, message: tuple[Any, ...]) -> None:
        if self.closed:
            return
        self._outgoing.append(frame(message))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._transport is None or not self._outgoing:
            return
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
        view = memoryview(data)
        try:
            while end - offset >= 4:
                (length,) = LENGTH.unpack_from(data, offset)
                if end - offset - 4 < length:
                    break
                plain = marshal.loads(view[offset + 4 : offset + 4 + length])
                offset += 4 + length
                on_message(_new_tuple(classes[plain[-1]], plain))
        finally:
            rest = end - offset
            self._incoming = bytearray(view[offset:]) if rest else bytearray()
            # The bytes the first incomplete frame needs before it is worth decoding.
            self._needed = 4 + LENGTH.unpack_from(data, offset)[0] if rest >= 4 else 4
            view.release()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._transport = None
        self._on_lost()

    def close(self) -> None:
        self._flush()
        if self._transport is not None:
            self._transport.close()
