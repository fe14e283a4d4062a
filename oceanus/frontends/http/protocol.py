"""A minimal HTTP/1.1 server protocol on httptools, for the inference hot path.

Why not uvicorn: under perf_analyzer load on 2 cores, uvicorn's per-request task, middleware and
two socket writes per response (headers, then body) took about a third of the event loop's time.
Measured alone with the same raw handler, this protocol serves about twice uvicorn's requests/s
(`python bench/http_stack.py`; figures in docs/measurements.md). It parses with the same httptools
parser, hands the frontend a complete request, and writes each response with one
`transport.write`. Requests whose answer is not immediate (inference) complete through a future
callback, with no task per request; when the client disconnects, that future is cancelled, which
drops a queued request.
"""

from __future__ import annotations

import asyncio
import http
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httptools

from oceanus.cpus import usable_cpus
from oceanus.frontends.http.busy_poll import BusyPoll

log = logging.getLogger("oceanus.http")

Headers = list[tuple[bytes, bytes]]

_REASONS = {status.value: status.phrase.encode() for status in http.HTTPStatus}
# Limits on a request's head (request line and headers): past them the request is refused (431,
# 414) and the connection closed, before more of it is buffered (docs/reliability.md).
MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 256
MAX_URL_BYTES = 16 * 1024
# A head that has begun must be complete this soon (slow-loris clients holding connections).
HEAD_TIMEOUT_S = 30.0
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# After the last response on a connection we send FIN and wait this long for the client's own
# close before closing: closing a socket that holds unread bytes sends a reset, and a reset can
# destroy a response the client has not read yet.
LINGER_S = 2.0


@dataclass(slots=True)
class HttpRequest:
    method: str
    path: str
    headers: dict[bytes, bytes]  # lower-case names; the last value of a repeated header wins
    body: bytes = b""
    too_large: bool = False
    # Monotonic times of the request's first byte and of its last (trace timestamps).
    begin_ns: int = 0
    end_ns: int = 0
    # Header names as the client wrote them, where not lower-case (header forwarding keeps them).
    names: dict[bytes, bytes] | None = None

    def header_items(self) -> list[tuple[str, bytes]]:
        """(name as sent, value) of every header."""
        names = self.names or {}
        return [(names.get(k, k).decode("latin-1"), v) for k, v in self.headers.items()]


@dataclass(slots=True)
class HttpResponse:
    status: int
    body: bytes | memoryview = b""
    headers: Headers = field(default_factory=list)
    # Called with the monotonic times around the write (traced requests only).
    on_sent: Callable[[int, int], None] | None = None
    # A body that comes in parts (sent with chunked transfer encoding; `body` is ignored): how a
    # frontend worker relays a streamed response the core process produces.
    stream: AsyncIterator[bytes] | None = None


@dataclass(slots=True)
class Pending:
    """An answer that comes later: `finish` turns the future's outcome into the response."""

    future: asyncio.Future[Any]
    finish: Callable[[asyncio.Future[Any]], HttpResponse]


@dataclass(slots=True)
class Streamed:
    """A response whose body comes in parts, sent with chunked transfer encoding (server-sent
    events). `parts` yields the head first (an HttpResponse; its body is ignored), then the
    body's chunks. The connection closing cancels it, which cancels the request behind it."""

    parts: AsyncIterator[HttpResponse | bytes]


Handler = Callable[[HttpRequest], "HttpResponse | Pending | Streamed"]


def encode_response(response: HttpResponse, keep_alive: bool, chunked: bool = False) -> bytes:
    """Status line, headers and body (chunked: the head only, body to follow in chunks)."""
    status = response.status
    parts: list[bytes | memoryview] = [
        b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Unknown"))
    ]
    for name, value in response.headers:
        parts.append(b"%s: %s\r\n" % (name, value))
    if chunked:
        parts.append(b"transfer-encoding: chunked\r\n")
    else:
        parts.append(b"content-length: %d\r\n" % len(response.body))
    if not keep_alive:
        parts.append(b"connection: close\r\n")
    parts.append(b"\r\n")
    if not chunked:
        parts.append(response.body)
    return b"".join(parts)


class Connections(set["HttpProtocol"]):
    """The open connections, and whether the server is draining (shutting down gracefully)."""

    draining = False


class HttpProtocol(asyncio.Protocol):
    """One client connection. Requests on it are answered in order (HTTP/1.1 pipelining).

    While the server drains, every request already received is answered, the last one on the
    connection with `Connection: close`, and then the connection closes."""

    def __init__(
        self,
        handler: Handler,
        max_body: int,
        connections: Connections,
        busy_poll: BusyPoll | None = None,
    ) -> None:
        self._handler = handler
        self._busy_poll = busy_poll
        self._max_body = max_body
        self._connections = connections
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._names: dict[bytes, bytes] = {}
        self._body: list[bytes] = []
        self._body_size = 0
        self._too_large = False
        self._begin_ns = 0
        # The head being parsed: its size so far and header count, and the answer when a limit
        # was passed; whether a too-large body was answered before it arrived.
        self._in_head = False
        self._head_bytes = 0
        self._header_count = 0
        self._refusal: HttpResponse | None = None
        self._head_timer: asyncio.TimerHandle | None = None
        self._answered_early = False
        self._waiting: deque[tuple[HttpRequest, bool]] = deque()
        self._current: Pending | None = None
        self._closing = False
        self._linger: asyncio.TimerHandle | None = None

    # ---- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._connections.discard(self)
        self._closing = True
        if self._linger is not None:
            self._linger.cancel()
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._waiting.clear()
        if self._current is not None and not self._current.future.done():
            self._current.future.cancel()  # a queued request leaves its queue
        self._current = None

    def data_received(self, data: bytes) -> None:
        if self._closing:  # sent after our `Connection: close` answer: not for us to read
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._reply_and_close(HttpResponse(400, b'{"error":"Upgrade is not supported"}'))
            return
        except httptools.HttpParserError:
            self._reply_and_close(self._refusal or HttpResponse(400, b'{"error":"Bad Request"}'))
            return
        if self._in_head:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._reply_and_close(
                    HttpResponse(431, b'{"error":"Request Header Fields Too Large"}')
                )
            elif self._head_timer is None:  # a head split over reads: it gets a deadline
                loop = asyncio.get_running_loop()
                self._head_timer = loop.call_later(HEAD_TIMEOUT_S, self._head_timed_out)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_head and not self._closing:
            self._reply_and_close(HttpResponse(408, b'{"error":"Request Timeout"}'))

    @property
    def idle(self) -> bool:
        return self._current is None and not self._waiting

    def close(self) -> None:
        """Close now: gracefully when idle, cutting the request short when busy."""
        if self._transport is None or self._transport.is_closing():
            return
        if self.idle:
            self._close_gracefully()
        else:
            self._transport.abort()

    def _close_gracefully(self) -> None:
        self._closing = True
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()  # sent once the buffered responses are out
        self._linger = asyncio.get_running_loop().call_later(LINGER_S, transport.close)

    # ---- httptools callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._begin_ns = time.monotonic_ns()
        if self._busy_poll is not None:
            self._busy_poll.request_began(self._begin_ns)
        self._url = b""
        self._headers = {}
        self._names = {}
        self._body = []
        self._body_size = 0
        self._too_large = False
        self._in_head = True
        self._head_bytes = 0
        self._header_count = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > MAX_URL_BYTES:
            self._refusal = HttpResponse(414, b'{"error":"URI Too Long"}')
            raise ValueError("request line too long")  # stops the parser

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > MAX_HEADERS:
            self._refusal = HttpResponse(431, b'{"error":"Request Header Fields Too Large"}')
            raise ValueError("too many headers")  # stops the parser
        lowered = name.lower()
        self._headers[lowered] = value
        if lowered != name:
            self._names[lowered] = name

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        length = self._headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self._max_body:
            self._too_large = True
            self._answer_early()
        elif self._headers.get(b"expect", b"").lower() == b"100-continue":
            assert self._transport is not None
            self._transport.write(_CONTINUE)

    def on_body(self, body: bytes) -> None:
        if self._too_large:
            return
        self._body_size += len(body)
        if self._body_size > self._max_body:
            self._too_large = True
            self._body = []
            self._answer_early()
            return
        self._body.append(body)

    def _answer_early(self) -> None:
        """A body over --http-max-input-size: answered now, without reading it (what is still
        coming is discarded, and the connection closes after the answer)."""
        self._answered_early = True
        self._queue(self._request(b""), keep_alive=False)

    def _request(self, body: bytes) -> HttpRequest:
        return HttpRequest(
            self._parser.get_method().decode("latin-1"),
            self._url.split(b"?", 1)[0].decode("latin-1"),
            self._headers,
            body,
            self._too_large,
            self._begin_ns,
            time.monotonic_ns(),
            self._names or None,
        )

    def _queue(self, request: HttpRequest, keep_alive: bool) -> None:
        if self._current is not None or self._waiting:
            self._waiting.append((request, keep_alive))
            return
        self._serve(request, keep_alive)

    def on_message_complete(self) -> None:
        if self._answered_early:
            self._answered_early = False
            return
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        keep_alive = self._parser.should_keep_alive() and not self._too_large
        self._queue(self._request(body), keep_alive)

    # ---- answering --------------------------------------------------------------------------

    def _serve(self, request: HttpRequest, keep_alive: bool) -> None:
        try:
            outcome = self._handler(request)
        except Exception:  # the handler answers its own errors; this is a bug
            log.exception("unhandled error serving %s %s", request.method, request.path)
            outcome = HttpResponse(500, b'{"error":"internal error"}')
        if isinstance(outcome, HttpResponse):
            self._write(outcome, keep_alive)
            return
        if isinstance(outcome, Streamed):
            task = asyncio.ensure_future(self._stream(outcome, keep_alive))
            self._current = Pending(task, _no_finish)  # closing the connection cancels it
            return
        self._current = outcome
        if outcome.future.done():  # answered already (a cheap model executed in place)
            self._finish(outcome, outcome.future, keep_alive)
            return
        outcome.future.add_done_callback(lambda future: self._finish(outcome, future, keep_alive))

    def _finish(self, pending: Pending, future: asyncio.Future[Any], keep_alive: bool) -> None:
        if self._closing or self._current is not pending:
            return
        self._current = None
        try:
            response = pending.finish(future)
        except Exception:
            log.exception("unhandled error finishing a response")
            response = HttpResponse(500, b'{"error":"internal error"}')
        self._write(response, keep_alive)

    def _write(self, response: HttpResponse, keep_alive: bool) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if response.stream is not None:
            task = asyncio.ensure_future(self._stream(Streamed(_parts(response)), keep_alive))
            self._current = Pending(task, _no_finish)  # closing the connection cancels it
            return
        if self._connections.draining and not self._waiting:
            keep_alive = False  # the last answer on this connection: the client must reconnect
        if response.on_sent is None:
            transport.write(encode_response(response, keep_alive))
        else:
            started = time.monotonic_ns()
            transport.write(encode_response(response, keep_alive))
            response.on_sent(started, time.monotonic_ns())
        if self._busy_poll is not None:
            self._busy_poll.response_sent()
        self._next(keep_alive)

    def _next(self, keep_alive: bool) -> None:
        """A response is out: close, or serve the next pipelined request."""
        if not keep_alive or (self._connections.draining and not self._waiting):
            self._close_gracefully()
            return
        if self._waiting:
            request, next_keep_alive = self._waiting.popleft()
            self._serve(request, next_keep_alive)

    async def _stream(self, outcome: Streamed, keep_alive: bool) -> None:
        parts = outcome.parts
        transport = self._transport
        assert transport is not None
        try:
            head = await anext(parts)
            assert isinstance(head, HttpResponse)
            keep_alive = keep_alive and not self._connections.draining
            transport.write(encode_response(head, keep_alive, chunked=True))
            async for chunk in parts:
                if chunk and not transport.is_closing():
                    assert isinstance(chunk, bytes)
                    transport.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            transport.write(b"0\r\n\r\n")
        except asyncio.CancelledError:
            raise
        except Exception:  # the producer answers its own errors; this is a bug
            log.exception("unhandled error streaming a response")
            transport.close()
            self._closing = True
            return
        finally:
            await parts.aclose()  # type: ignore[attr-defined]
        if self._closing or transport.is_closing():
            return
        self._current = None
        self._next(keep_alive)

    def _reply_and_close(self, response: HttpResponse) -> None:
        response.headers.append((b"content-type", b"application/json"))
        self._write(response, keep_alive=False)


async def _parts(response: HttpResponse) -> AsyncIterator[HttpResponse | bytes]:
    """A response with a `stream` body as a Streamed outcome's parts: head, then chunks."""
    assert response.stream is not None
    stream = response.stream
    try:
        yield response
        async for chunk in stream:
            yield chunk
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()


def _no_finish(future: asyncio.Future[Any]) -> HttpResponse:
    raise AssertionError("a streamed response finishes itself")


class HttpServer:
    """Listens, tracks connections, and on shutdown waits for in-flight requests.

    `busy_poll_us`: after a response, how long the loop may poll for the next request instead of
    sleeping (busy_poll.py); 0 turns it off, and so does having a single CPU."""

    def __init__(self, handler: Handler, max_body: int, busy_poll_us: int = 0) -> None:
        self._handler = handler
        self._max_body = max_body
        self._busy_poll_us = busy_poll_us
        self.busy_poll: BusyPoll | None = None
        self._connections = Connections()
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int, reuse_port: bool = False) -> None:
        """Listen; `reuse_port`: share the port with other processes (SO_REUSEPORT), as the
        frontend worker processes do."""
        loop = asyncio.get_running_loop()
        if self._busy_poll_us and usable_cpus() > 1:
            self.busy_poll = BusyPoll(self._busy_poll_us, loop)
        self._server = await loop.create_server(
            lambda: HttpProtocol(self._handler, self._max_body, self._connections, self.busy_poll),
            host=host,
            port=port,
            reuse_address=True,
            reuse_port=reuse_port or None,
            backlog=2048,
        )

    @property
    def port(self) -> int:
        """The port listened on (the one the system chose, when started on port 0)."""
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self, timeout_s: float) -> bool:
        """Drain: stop listening, answer every request already received (each connection's last
        answer says `Connection: close`), close idle connections gracefully. Returns whether
        everything finished within timeout_s; what has not is then cut off."""
        loop = asyncio.get_running_loop()
        self._connections.draining = True
        if self._server is not None:
            self._server.close()
        deadline = loop.time() + timeout_s
        while any(not c.idle for c in self._connections) and loop.time() < deadline:
            await asyncio.sleep(0.01)
        finished = all(c.idle for c in self._connections)
        for connection in list(self._connections):
            connection.close()
        # Let the lingering closes end (each within LINGER_S), so their last bytes go out.
        linger_deadline = loop.time() + LINGER_S + 0.5
        while self._connections and loop.time() < linger_deadline:
            await asyncio.sleep(0.01)
        if self._server is not None:
            await self._server.wait_closed()
        return finished
