"""One client connection of the gRPC transport: its HTTP/2 state (framing.py), its calls, their
flow control, its pings (keepalive.py), connection age and going away."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, cast

import grpc

from oceanus.frontends.grpc_transport import framing, wire
from oceanus.frontends.grpc_transport.call import (
    BAD_TIMEOUT,
    OK_TRAILERS,
    RESPONSE_HEADERS,
    Call,
    Compressed,
    MessageError,
    MessageReader,
    RequestStream,
    RpcAbort,
    inflate_message,
    parse_timeout,
    status_trailers,
)
from oceanus.frontends.grpc_transport.keepalive import Pings

if TYPE_CHECKING:
    from oceanus.frontends.grpc_transport.server import H2Server

log = logging.getLogger("oceanus.grpc")

# Bytes queued on a streaming call before its writer waits for the peer to read.
_WRITE_HIGH_WATER = 1 << 20


class Connection(asyncio.Protocol):
    """One client connection: its HTTP/2 state, its calls, its timers."""

    def __init__(self, server: H2Server) -> None:
        self._server = server
        self._limits = server.limits
        self._handlers = server.handlers
        self._loop = asyncio.get_running_loop()
        self._h2 = framing.Http2(self, self._limits.max_concurrent_streams)
        self._calls: dict[int, Call] = {}
        # Calls with bytes queued that wait for the peer's window: all a connection-level
        # WINDOW_UPDATE has to look at (a flood of them walked every call).
        self._blocked: dict[int, Call] = {}
        # Why we stopped reading: the peer reads none of our answers ("write"), or frames
        # wait past a turn's budget ("turn"). Read again when neither holds.
        self._not_reading: set[str] = set()
        self._turn_scheduled = False
        self._transport: asyncio.Transport | None = None
        self._flush_scheduled = False
        self._going_away = False
        self._drained = asyncio.Event()
        self._timers: list[asyncio.TimerHandle] = []
        self._pings = Pings(self._limits, self._h2, self._has_calls, self._flush, self._close)
        self.peer = ""

    # ---- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        address = transport.get_extra_info("peername")
        if isinstance(address, tuple):
            host, port = address[0], address[1]
            self.peer = f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
        self._server.connections.add(self)
        self._h2.initiate()
        self._pings.peer = self.peer
        self._pings.start()
        limits = self._limits
        if limits.max_age_s is not None:
            self._timers.append(self._loop.call_later(limits.max_age_s, self._age_reached))
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self._transport = None
        for timer in self._timers:
            timer.cancel()
        self._pings.stop()
        for call in list(self._calls.values()):
            self._abandon(call)
        self._calls.clear()
        self._h2.streams.clear()  # the framing and the connection refer to each other
        self._drained.set()

    def data_received(self, data: bytes) -> None:
        try:
            self._h2.receive(data)
        except framing.ConnectionError_ as exc:
            log.debug("gRPC connection from %s: HTTP/2 error %d: %s", self.peer, exc.code, exc)
            self._h2.goaway(exc.code)
            self._flush()
            self._close()
            return
        self._flush()
        if self._h2.pending:
            # Past this turn's frame budget: the rest waits for the next turn, after the
            # other connections have had theirs, and nothing more is read meanwhile.
            self._stop_reading("turn")
            if not self._turn_scheduled:
                self._turn_scheduled = True
                self._loop.call_soon(self._next_turn)

    def _next_turn(self) -> None:
        self._turn_scheduled = False
        if self._transport is None:
            return
        self.data_received(b"")
        if not self._h2.pending:
            self._read_again("turn")

    def _stop_reading(self, why: str) -> None:
        if not self._not_reading and self._transport is not None:
            self._transport.pause_reading()
        self._not_reading.add(why)

    def _read_again(self, why: str) -> None:
        if why not in self._not_reading:
            return
        self._not_reading.discard(why)
        if not self._not_reading and self._transport is not None:
            self._transport.resume_reading()

    def pause_writing(self) -> None:
        # The peer reads nothing of what we send: read nothing of what it sends (a flood of
        # SETTINGS or PINGs would otherwise fill our buffer with the ACKs it never reads).
        self._server.paused.add(self)
        self._stop_reading("write")

    def resume_writing(self) -> None:
        self._server.paused.discard(self)
        self._read_again("write")
        for call in list(self._calls.values()):
            self._pump(call)

    # ---- events.Events ----------------------------------------------------------------------

    def on_request(self, stream_id: int, headers: list[tuple[bytes, bytes]]) -> None:
        path = b""
        encoding = b"identity"
        timeout_value = None
        for key, value in headers:
            if key == b":path":
                path = value
            elif key == b"grpc-timeout":
                timeout_value = value
            elif key == b"grpc-encoding":
                encoding = value
        handler = self._handlers.get(path)
        if self._going_away:
            self._h2.reset(stream_id, wire.REFUSED_STREAM)
            return
        timeout = None
        if timeout_value is not None:
            timeout = parse_timeout(timeout_value)
            if timeout is None:  # grpc core: INTERNAL in its words, no handler runs
                self._trailers_only(stream_id, grpc.StatusCode.INTERNAL, BAD_TIMEOUT)
                return
            if timeout <= 0:  # spent before it came: answered at once, as by grpc core
                self._trailers_only(
                    stream_id, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"
                )
                return
        if handler is None:
            self._trailers_only(stream_id, grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
            return
        reader = MessageReader(encoding, self._limits.max_message)
        call = Call(self, stream_id, handler, headers, reader)
        self._calls[stream_id] = call
        self._pings.without_data = 0
        if handler.stream_stream is not None:
            call.requests = RequestStream(handler.request_deserializer, reader, call)
            call.task = self._loop.create_task(self._run(call))
        elif handler.unary_unary is None:
            del self._calls[stream_id]
            self._trailers_only(stream_id, grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
            return
        if timeout is not None:
            call.timer = self._loop.call_later(timeout, self._deadline, call)

    def on_data(self, stream_id: int, data: bytes) -> None:
        # The windows refill as the handler reads (flow.py): bytes that come while messages
        # wait unread are held until it has read them all, the others given back at once.
        call = self._calls.get(stream_id)
        if call is None or call.trailers is not None:
            self._h2.consumed(stream_id, len(data))
            return  # a call answered already (or unknown): what it still sends is dropped
        try:
            messages = call.reader.feed(data)
        except MessageError as exc:
            self._h2.consumed(stream_id, len(data))
            self._end_call(call, exc.code, exc.details)
            return
        requests = call.requests
        if requests is not None:
            for message in messages:
                requests.push(message)
            unread = requests.unread
        else:  # a unary call: bytes past its one message are held (the call fails at its end)
            call.messages.extend(messages)
            unread = len(call.messages) > 1
        if unread:
            call.held += len(data)
        else:
            self._h2.consumed(stream_id, len(data))

    def release(self, call: Call) -> None:
        """The handler has read what the call received (or the call is over): the client may
        send as much again."""
        if call.held:
            self._h2.consumed(call.stream_id, call.held)
            call.held = 0
            self._schedule_flush()

    def on_end(self, stream_id: int) -> None:
        call = self._calls.get(stream_id)
        if call is None or call.trailers is not None:
            return
        if call.requests is not None:
            call.requests.end()
            return
        if call.reader.partial or len(call.messages) != 1:
            got = "a partial message" if call.reader.partial else f"{len(call.messages)}"
            self._end_call(
                call, grpc.StatusCode.INTERNAL, f"Expected one request message, received {got}"
            )
            return
        call.task = self._loop.create_task(self._run(call, call.messages.pop()))

    def on_reset(self, stream_id: int) -> None:
        call = self._calls.pop(stream_id, None)
        if call is not None:
            self._abandon(call)
            self._check_drained()

    def on_ping(self) -> None:
        self._pings.received()

    def on_ping_ack(self) -> None:
        self._pings.unanswered = 0

    def _has_calls(self) -> bool:
        return bool(self._calls)

    def on_goaway(self) -> None:
        self._going_away = True

    # ---- running handlers ---------------------------------------------------------------

    async def _run(self, call: Call, data: bytes | Compressed | None = None) -> None:
        """The call's handler: a unary one with its request `data`, a streaming one (data
        None) reading `call.requests`; its outcome becomes the call's status."""
        handler = call.handler
        try:
            if call.requests is not None:
                await handler.stream_stream(call.requests, call)
            else:
                if isinstance(data, Compressed):
                    data = await inflate_message(data, call.reader.encoding, call.reader.limit)
                deserialize = handler.request_deserializer
                request = data if deserialize is None else deserialize(data)
                response = await handler.unary_unary(request, call)
                serialize = handler.response_serializer
                self._queue_message(call, response if serialize is None else serialize(response))
        except asyncio.CancelledError:
            self._cancelled(call)
            return
        except (RpcAbort, MessageError) as abort:
            self._end_call(call, abort.code, abort.details)
            return
        except Exception as exc:
            self._failed(call, exc)
            return
        self._end_call(call, None, "")

    def _failed(self, call: Call, exc: Exception) -> None:
        log.error("gRPC handler of stream %d failed", call.stream_id, exc_info=exc)
        self._end_call(call, grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc)}: {exc}")

    def _cancelled(self, call: Call) -> None:
        if call.deadline_hit:
            self._end_call(call, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        elif self._calls.get(call.stream_id) is call:
            self._end_call(call, grpc.StatusCode.CANCELLED, "Cancelled")

    def _deadline(self, call: Call) -> None:
        call.deadline_hit = True
        task = call.task
        if task is not None and not task.done():
            task.cancel()
            # A task cancelled before its first step never runs its body (nor _cancelled):
            # a deadline of a few ns would leave the call unanswered.
            task.add_done_callback(lambda _: self._cancelled(call))
        else:  # a unary call still receiving its request
            self._end_call(call, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def _abandon(self, call: Call) -> None:
        """The client reset the call or left: its handler is cancelled, nothing is sent."""
        call.trailers = []
        call.outgoing.clear()
        self._blocked.pop(call.stream_id, None)
        if call.task is not None and not call.task.done():
            call.task.cancel()
        if call.writable is not None and not call.writable.done():
            call.writable.set_exception(asyncio.CancelledError())
        call.finished()

    # ---- responses ----------------------------------------------------------------------

    async def send_message(self, call: Call, data: bytes) -> None:
        """A streaming call's response message; waits while the peer is behind."""
        if call.trailers is not None:
            raise asyncio.CancelledError()  # the client reset the call
        self._queue_message(call, data)
        if sum(map(len, call.outgoing)) > _WRITE_HIGH_WATER or self in self._server.paused:
            call.writable = self._loop.create_future()
            try:
                await call.writable
            finally:
                call.writable = None

    def _queue_message(self, call: Call, data: bytes) -> None:
        prefix = b"\0" + len(data).to_bytes(4, "big")
        if len(data) < 65536:
            call.outgoing.append(prefix + data)
        else:
            call.outgoing.append(prefix)
            call.outgoing.append(data)
        self._pump(call)

    def _end_call(self, call: Call, code: grpc.StatusCode | None, details: str) -> None:
        if call.trailers is not None:
            return
        if code is None:
            call.trailers = OK_TRAILERS
        elif not call.headers_sent and not call.outgoing:
            self._calls.pop(call.stream_id, None)
            call.trailers = []
            self._trailers_only(call.stream_id, code, details)
            call.finished()
            self._check_drained()
            return
        else:
            call.trailers = status_trailers(code, details)
        self._pump(call)

    def _trailers_only(self, stream_id: int, code: grpc.StatusCode, details: str) -> None:
        # a client still sending is told to stop (RST_STREAM NO_ERROR, in end_stream)
        self._h2.end_stream(stream_id, RESPONSE_HEADERS + status_trailers(code, details))
        self._schedule_flush()

    def on_window(self, stream_id: int) -> None:
        if stream_id:
            call = self._calls.get(stream_id)
            if call is not None:
                self._pump(call)
            return
        for call in list(self._blocked.values()):
            self._pump(call)

    def _pump(self, call: Call) -> None:
        """Send what the peer's windows allow of the call's queued bytes, then its trailers."""
        h2c = self._h2
        stream_id = call.stream_id
        outgoing = call.outgoing
        if stream_id not in h2c.streams:  # reset by a stream error, or ended
            self._blocked.pop(stream_id, None)
            if self._calls.pop(stream_id, None) is not None:
                self._abandon(call)
        else:
            if not call.headers_sent and (outgoing or call.trailers):
                h2c.send_headers(stream_id, RESPONSE_HEADERS)
                call.headers_sent = True
                self._pings.data_sent()
            while outgoing:
                window = h2c.window(stream_id)
                if window <= 0:
                    break
                self._pings.data_sent()
                first = outgoing[0]
                size = min(window, h2c.max_send_frame, len(first) - call.offset)
                if call.offset == 0 and size == len(first):
                    h2c.send_data(stream_id, first)
                    outgoing.popleft()
                else:
                    h2c.send_data(stream_id, first[call.offset : call.offset + size])
                    call.offset += size
                    if call.offset == len(first):
                        outgoing.popleft()
                        call.offset = 0
            if outgoing:
                self._blocked[stream_id] = call
            elif self._blocked:
                self._blocked.pop(stream_id, None)
            if not outgoing and call.trailers:
                h2c.end_stream(stream_id, call.trailers)
                call.trailers = []
                if self._calls.pop(stream_id, None) is not None:
                    call.finished()
        writable = call.writable
        if (
            writable is not None
            and not writable.done()
            and self not in self._server.paused
            and sum(map(len, outgoing)) <= _WRITE_HIGH_WATER
        ):
            writable.set_result(None)
        self._schedule_flush()
        self._check_drained()

    def _check_drained(self) -> None:
        if self._going_away and not self._calls:
            self._drained.set()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        data = self._h2.data_to_send()
        if data and self._transport is not None:
            self._transport.write(data)

    def _close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    # ---- age, going away -------------------------------------------------------------------

    def _age_reached(self) -> None:
        self.go_away()
        grace = self._limits.age_grace_s
        if grace is not None:
            self._timers.append(self._loop.call_later(grace, self._close))

    def go_away(self) -> None:
        """Tell the client to open no new calls here; the calls it has run to their end."""
        if self._transport is None or self._going_away:
            return
        self._going_away = True
        self._h2.goaway(wire.NO_ERROR)
        self._flush()
        if not self._calls:
            self._drained.set()
            self._close()

    async def drained(self) -> None:
        await self._drained.wait()
        self._close()

    def cancel_calls(self) -> None:
        for call in list(self._calls.values()):
            if call.task is not None and not call.task.done():
                call.task.cancel()
        self._close()
