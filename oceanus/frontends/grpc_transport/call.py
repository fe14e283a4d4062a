"""One gRPC call on the HTTP/2 transport: the servicer context handlers see (what they use of
grpc.aio's ServicerContext), the stream of request messages, and the wire details of gRPC over
HTTP/2 (message prefix, grpc-timeout, grpc-status / grpc-message, metadata)."""

from __future__ import annotations

import asyncio
import base64
import zlib
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

from oceanus.frontends.compression import INFLATE_INLINE_BYTES, inflate

if TYPE_CHECKING:
    from oceanus.frontends.grpc_transport.connection import Connection

# Headers of a request that grpcio does not hand to the servicer as metadata.
_NOT_METADATA = frozenset(
    (b"te", b"content-type", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding")
)
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
# Bytes a grpc-message may carry as they are (the gRPC spec's percent-encoding).
_PLAIN = frozenset(range(0x20, 0x7F)) - {ord("%")}
RESPONSE_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]
OK_TRAILERS = [(b"grpc-status", b"0")]


class RpcAbort(Exception):
    """Raised by `Call.abort`: the call ends with this status (grpc.aio's AbortError)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class MessageError(Exception):
    """A request message the call cannot take: ends the call with `code`."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


# A status text is cut past this many characters: texts echo what clients sent (a model name,
# a parameter), and a client refuses trailers over its metadata limit (grpc core: 8 KiB), so
# a longer text would cost both sides without being read. Triton's words for any name of a
# sensible length are kept whole.
MAX_DETAILS = 2048
_CUT_MARK = "..."


def status_trailers(code: grpc.StatusCode, details: str) -> list[tuple[bytes, bytes]]:
    trailers = [(b"grpc-status", str(code.value[0]).encode())]
    if details:
        if len(details) > MAX_DETAILS:
            details = details[: MAX_DETAILS - len(_CUT_MARK)] + _CUT_MARK
        trailers.append((b"grpc-message", percent_encode(details)))
    return trailers


def percent_encode(text: str) -> bytes:
    data = text.encode()
    if all(byte in _PLAIN for byte in data):
        return data
    return b"".join(bytes((b,)) if b in _PLAIN else b"%%%02X" % b for b in data)


def parse_timeout(value: bytes) -> float | None:
    """grpc-timeout ("100m", "5S", ...) in seconds; None when malformed. As grpc core reads
    it: whitespace around it ignored, up to 9 digits (the spec says 8; grpc core takes 9)."""
    value = value.strip()
    unit = _TIMEOUT_UNITS.get(value[-1:])
    digits = value[:-1]
    if unit is None or not digits.isdigit() or len(digits) > 9:
        return None
    return int(digits) * unit


# grpc core's words for a grpc-timeout it cannot read (INTERNAL, before any handler runs).
BAD_TIMEOUT = "Error parsing 'grpc-timeout' metadata"


def metadata_of(headers: list[tuple[bytes, bytes]]) -> tuple[tuple[str, str | bytes], ...]:
    """What grpcio's `invocation_metadata()` gives: every header but pseudo-headers and gRPC's
    own, keys as sent (lower case), `-bin` values base64-decoded."""
    pairs: list[tuple[str, str | bytes]] = []
    for key, value in headers:
        if key[:1] == b":" or key in _NOT_METADATA:
            continue
        name = key.decode("latin-1")
        if name.endswith("-bin"):
            pairs.append((name, base64.b64decode(value + b"=" * (-len(value) % 4))))
        else:
            pairs.append((name, value.decode("latin-1")))
    return tuple(pairs)


def decompress(data: bytes, encoding: bytes, limit: int) -> bytes:
    """A message sent with the compressed flag, in the call's grpc-encoding."""
    try:
        message = inflate(data, encoding, limit)
    except zlib.error as exc:
        raise MessageError(grpc.StatusCode.INTERNAL, f"Failed to decompress: {exc}") from None
    if message is None:
        raise MessageError(
            grpc.StatusCode.UNIMPLEMENTED,
            f"Compression algorithm '{encoding.decode('latin-1')}' is not supported",
        )
    if len(message) > limit:
        raise MessageError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"Received message larger than max (>{limit} vs. {limit})",
        )
    return message


# Compressed messages up to INFLATE_INLINE_BYTES are inflated as they arrive; larger ones on
# a thread, by the call's task, so one small request never holds the loop for the second a
# gigabyte of zeros takes to inflate.


class Compressed:
    """A message still compressed, inflated by `inflate_message` where waiting is allowed."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


async def inflate_message(message: Compressed, encoding: bytes, limit: int) -> bytes:
    return await asyncio.to_thread(decompress, message.data, encoding, limit)


class MessageReader:
    """Cuts the call's DATA into gRPC messages (1-byte flag, 4-byte big-endian length)."""

    __slots__ = ("_buffer", "_encoding", "_limit")

    @property
    def encoding(self) -> bytes:
        return self._encoding

    @property
    def limit(self) -> int:
        return self._limit

    def __init__(self, encoding: bytes, limit: int) -> None:
        self._buffer = bytearray()
        self._encoding = encoding
        self._limit = limit

    def feed(self, data: bytes) -> list[bytes | Compressed]:
        buffer = self._buffer
        if not buffer and len(data) >= 5:
            # The common case: one whole message in one DATA frame, no copy.
            length = int.from_bytes(data[1:5], "big")
            if len(data) == 5 + length and data[0] == 0 and length <= self._limit:
                return [data[5:]]
        buffer += data
        messages: list[bytes | Compressed] = []
        while len(buffer) >= 5:
            length = int.from_bytes(buffer[1:5], "big")
            if length > self._limit:
                raise MessageError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"Received message larger than max ({length} vs. {self._limit})",
                )
            if len(buffer) < 5 + length:
                break
            flag = buffer[0]
            message = bytes(buffer[5 : 5 + length])
            del buffer[: 5 + length]
            if flag & 1:
                if len(message) > INFLATE_INLINE_BYTES:
                    messages.append(Compressed(message))
                    continue
                message = decompress(message, self._encoding, self._limit)
            messages.append(message)
        return messages

    @property
    def partial(self) -> bool:
        return bool(self._buffer)


class RequestStream:
    """The request messages of a streaming call, as the async iterator handlers read."""

    __slots__ = ("_call", "_deserialize", "_ended", "_messages", "_reader", "_waiter")

    def __init__(
        self,
        deserialize: Callable[[bytes], Any] | None,
        reader: MessageReader | None = None,
        call: Call | None = None,
    ) -> None:
        self._messages: deque[bytes | Compressed] = deque()
        self._reader = reader
        self._call = call  # told when every message received has been read
        self._ended = False
        self._waiter: asyncio.Future[None] | None = None
        self._deserialize = deserialize

    def push(self, message: bytes | Compressed) -> None:
        self._messages.append(message)
        self._wake()

    def end(self) -> None:
        self._ended = True
        self._wake()

    @property
    def unread(self) -> bool:
        """Whether messages wait for the handler to read them."""
        return bool(self._messages)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> Any:
        while not self._messages:
            if self._ended:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        message = self._messages.popleft()
        if not self._messages and self._call is not None:
            self._call.connection.release(self._call)
        if isinstance(message, Compressed):
            reader = self._reader
            assert reader is not None
            message = await inflate_message(message, reader.encoding, reader.limit)
        return message if self._deserialize is None else self._deserialize(message)


class Call:
    """A call's state on its connection, and the context its handler is given."""

    __slots__ = (
        "_callbacks",
        "connection",
        "deadline_hit",
        "handler",
        "headers",
        "headers_sent",
        "held",
        "messages",
        "metadata",
        "offset",
        "outgoing",
        "reader",
        "requests",
        "stream_id",
        "task",
        "timer",
        "trailers",
        "writable",
    )

    def __init__(
        self,
        connection: Connection,
        stream_id: int,
        handler: grpc.RpcMethodHandler,
        headers: list[tuple[bytes, bytes]],
        reader: MessageReader,
    ) -> None:
        self.connection = connection
        self.stream_id = stream_id
        self.handler = handler
        self.headers = headers
        # made from the headers when a handler first asks (most never do)
        self.metadata: tuple[tuple[str, str | bytes], ...] | None = None
        self.reader = reader
        self.requests: RequestStream | None = None
        self.messages: list[bytes | Compressed] = []  # a unary call's request
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.deadline_hit = False
        self.headers_sent = False
        # Bytes waiting for the peer's flow-control window, and where the first one is cut.
        self.outgoing: deque[bytes] = deque()
        self.offset = 0
        self.trailers: list[tuple[bytes, bytes]] | None = None
        self.writable: asyncio.Future[None] | None = None
        self.held = 0  # request bytes received while messages waited unread (flow.py)
        self._callbacks: list[Callable[[Any], None]] = []

    # ---- what handlers use of grpc.aio's ServicerContext --------------------------------

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        if self.metadata is None:
            self.metadata = metadata_of(self.headers)
        return self.metadata

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise RpcAbort(code, details)

    async def write(self, message: Any) -> None:
        serialize = self.handler.response_serializer
        data = message if serialize is None else serialize(message)
        await self.connection.send_message(self, data)

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        self._callbacks.append(callback)

    # ---- the transport's side --------------------------------------------------------------

    def finished(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.held:
            self.connection.release(self)  # what it held is the connection's window again
        # The task's frames (and a cancelled one's traceback) refer to the call, the request
        # stream refers back to it: without these references no cycle is left, and a call's
        # memory goes when it ends, not at the collector's next full pass (after 1,000 calls
        # held by one client, the RSS stayed ~10 % up until then).
        self.task = None
        self.requests = None
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)
