"""A message channel between two processes over a Unix socket, on an asyncio loop.

Messages are tuples (messages.py) framed as a 4-byte length + `marshal` bytes. Under load many
travel per wake-up both ways: `send` only appends to a buffer, and one callback per loop
iteration writes everything buffered with a single `transport.write`; `data_received` decodes
every complete frame it got before returning.
"""

from __future__ import annotations

import asyncio
import marshal
import socket
import struct
from collections.abc import Callable
from typing import Any

_LENGTH = struct.Struct("<I")

Message = tuple[Any, ...]


class Channel(asyncio.Protocol):
    """One end of a worker <-> core channel; `on_message` gets each message in order."""

    def __init__(self, on_message: Callable[[Message], None], on_lost: Callable[[], None]) -> None:
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
        on_message: Callable[[Message], None],
        on_lost: Callable[[], None],
    ) -> Channel:
        loop = asyncio.get_running_loop()
        _, channel = await loop.create_unix_connection(lambda: cls(on_message, on_lost), sock=sock)
        return channel

    # ---- sending ----------------------------------------------------------------------------

    def send(self, message: Message) -> None:
        if self.closed:
            return
        data = marshal.dumps(message)
        self._outgoing.append(_LENGTH.pack(len(data)))
        self._outgoing.append(data)
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
        view = memoryview(data)
        try:
            while end - offset >= 4:
                (length,) = _LENGTH.unpack_from(data, offset)
                if end - offset - 4 < length:
                    break
                message = marshal.loads(view[offset + 4 : offset + 4 + length])
                offset += 4 + length
                on_message(message)
        finally:
            rest = end - offset
            self._incoming = bytearray(view[offset:]) if rest else bytearray()
            # The bytes the first incomplete frame needs before it is worth decoding.
            self._needed = 4 + _LENGTH.unpack_from(data, offset)[0] if rest >= 4 else 4
            view.release()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._transport = None
        self._on_lost()

    def close(self) -> None:
        self._flush()
        if self._transport is not None:
            self._transport.close()
