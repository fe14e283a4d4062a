"""One client connection of the h2 transport: its HTTP/2 state, its calls, their flow
control, keepalive and grpc core's ping policy, connection age and going away."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING, Any, cast

import grpc
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
from hyperframe.frame import GoAwayFrame

from oceanus.frontends.grpc.h2call import (
    OK_TRAILERS,
    RESPONSE_HEADERS,
    Call,
    MessageError,
    MessageReader,
    RequestStream,
    RpcAbort,
    parse_timeout,
    status_trailers,
)

if TYPE_CHECKING:
    from oceanus.frontends.grpc.h2server import H2Server

log = logging.getLogger("oceanus.grpc")

_CONFIG = h2.config.H2Configuration(
    client_side=False,
    header_encoding=None,
    validate_inbound_headers=False,
    normalize_inbound_headers=False,
    validate_outbound_headers=False,
    normalize_outbound_headers=False,
)
# Receive windows: large enough that a tensor of a few MiB crosses without waiting for a
# WINDOW_UPDATE round trip; the call's message limit bounds what a call may buffer.
_WINDOW = 16 << 20
_MAX_FRAME = 1 << 20
_NO_CALLS_PING_INTERVAL_S = 7200.0  # grpc core: pings without calls, when not permitted
# Bytes queued on a streaming call before its writer waits for the peer to read.
_WRITE_HIGH_WATER = 1 << 20


class Connection(asyncio.Protocol):
    """One client connection: its h2 state, its calls, its timers."""

    def __init__(self, server: H2Server) -> None:
        self._server = server
        self._limits = server.limits
        self._handlers = server.handlers
        self._loop = asyncio.get_running_loop()
        self._h2 = h2.connection.H2Connection(config=_CONFIG)
        self._calls: dict[int, Call] = {}
        self._transport: asyncio.Transport | None = None
        self._flush_scheduled = False
        self._going_away = False
        self._drained = asyncio.Event()
        self._timers: list[asyncio.TimerHandle] = []
        self._ping_due: asyncio.TimerHandle | None = None
        self._ping_deadline: asyncio.TimerHandle | None = None
        self._pings_unanswered = 0
        self._pings_without_data = 0
        self._last_ping_received: float | None = None
        self._ping_strikes = 0
        self.peer = ""

    # ---- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        address = transport.get_extra_info("peername")
        if isinstance(address, tuple):
            host, port = address[0], address[1]
            self.peer = f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
        self._server.connections.add(self)
        h2c = self._h2
        h2c.initiate_connection()
        # In force once the client acknowledges them (h2 applies them then).
        h2c.update_settings(
            {
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 2**31 - 1,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: _WINDOW,
                h2.settings.SettingCodes.MAX_FRAME_SIZE: _MAX_FRAME,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 64 << 10,
            }
        )
        h2c.increment_flow_control_window(_WINDOW)
        self._schedule_ping()
        limits = self._limits
        if limits.max_age_s is not None:
            self._timers.append(self._loop.call_later(limits.max_age_s, self._age_reached))
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self._transport = None
        for timer in self._timers:
            timer.cancel()
        for handle in (self._ping_due, self._ping_deadline):
            if handle is not None:
                handle.cancel()
        for call in list(self._calls.values()):
            self._abandon(call)
        self._calls.clear()
        self._drained.set()

    def data_received(self, data: bytes) -> None:
        try:
            events = self._h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            log.debug("gRPC connection from %s: HTTP/2 protocol error: %s", self.peer, exc)
            self._h2.close_connection(error_code=h2.errors.ErrorCodes.PROTOCOL_ERROR)
            self._flush()
            self._close()
            return
        event: Any
        for event in events:
            kind = type(event)
            if kind is h2.events.DataReceived:
                self._on_data(event)
            elif kind is h2.events.RequestReceived:
                self._on_request(event)
            elif kind is h2.events.StreamEnded:
                self._on_end(event.stream_id)
            elif kind is h2.events.WindowUpdated:
                self._on_window(event.stream_id)
            elif kind is h2.events.StreamReset:
                call = self._calls.pop(event.stream_id, None)
                if call is not None:
                    self._abandon(call)
                    self._check_drained()
            elif kind is h2.events.PingReceived:
                self._on_ping()
            elif kind is h2.events.PingAckReceived:
                self._pings_unanswered = 0
            elif kind is h2.events.RemoteSettingsChanged:
                self._on_window(0)
            elif kind is h2.events.ConnectionTerminated:
                self._going_away = True
        self._flush()

    def pause_writing(self) -> None:
        self._server.paused.add(self)

    def resume_writing(self) -> None:
        self._server.paused.discard(self)
        for call in self._calls.values():
            self._pump(call)

    # ---- requests -----------------------------------------------------------------------

    def _on_request(self, event: Any) -> None:
        stream_id = event.stream_id
        path = b""
        encoding = b"identity"
        timeout = None
        for key, value in event.headers:
            if key == b":path":
                path = value
            elif key == b"grpc-timeout":
                timeout = parse_timeout(value)
            elif key == b"grpc-encoding":
                encoding = value
        handler = self._handlers.get(path)
        if self._going_away:
            self._h2.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        if handler is None:
            self._trailers_only(stream_id, grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
            return
        reader = MessageReader(encoding, self._limits.max_message)
        call = Call(self, stream_id, handler, event.headers, reader)
        self._calls[stream_id] = call
        self._pings_without_data = 0
        if handler.stream_stream is not None:
            call.requests = RequestStream(handler.request_deserializer)
            call.task = self._loop.create_task(self._run_stream(call))
        elif handler.unary_unary is None:
            del self._calls[stream_id]
            self._trailers_only(stream_id, grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
            return
        if timeout is not None:
            call.timer = self._loop.call_later(timeout, self._deadline, call)

    def _on_data(self, event: Any) -> None:
        stream_id = event.stream_id
        size = event.flow_controlled_length
        if size:
            self._h2.acknowledge_received_data(size, stream_id)
        call = self._calls.get(stream_id)
        if call is None or call.trailers is not None:
            return  # a call answered already (or unknown): what it still sends is dropped
        try:
            messages = call.reader.feed(event.data)
        except MessageError as exc:
            self._end_call(call, exc.code, exc.details)
            return
        if not messages:
            return
        if call.requests is not None:
            for message in messages:
                call.requests.push(message)
        else:
            call.messages.extend(messages)

    def _on_end(self, stream_id: int) -> None:
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
        call.task = self._loop.create_task(self._run_unary(call, call.messages.pop()))

    # ---- running handlers ---------------------------------------------------------------

    async def _run_unary(self, call: Call, data: bytes) -> None:
        handler = call.handler
        try:
            deserialize = handler.request_deserializer
            request = data if deserialize is None else deserialize(data)
            response = await handler.unary_unary(request, call)
            serialize = handler.response_serializer
            body = response if serialize is None else serialize(response)
        except asyncio.CancelledError:
            self._cancelled(call)
            return
        except RpcAbort as abort:
            self._end_call(call, abort.code, abort.details)
            return
        except Exception as exc:
            self._failed(call, exc)
            return
        self._queue_message(call, body)
        self._end_call(call, None, "")

    async def _run_stream(self, call: Call) -> None:
        assert call.requests is not None
        try:
            await call.handler.stream_stream(call.requests, call)
        except asyncio.CancelledError:
            self._cancelled(call)
            return
        except RpcAbort as abort:
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
        if call.task is not None and not call.task.done():
            call.task.cancel()
        else:  # a unary call still receiving its request
            self._end_call(call, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def _abandon(self, call: Call) -> None:
        """The client reset the call or left: its handler is cancelled, nothing is sent."""
        call.trailers = []
        call.outgoing.clear()
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
        try:
            self._h2.send_headers(
                stream_id, RESPONSE_HEADERS + status_trailers(code, details), end_stream=True
            )
            self._stop_reading(stream_id)
        except h2.exceptions.StreamClosedError:
            return
        self._schedule_flush()

    def _stop_reading(self, stream_id: int) -> None:
        """A call answered before its client finished sending: RST_STREAM NO_ERROR tells the
        client to stop (RFC 9113 8.1), as grpc servers do."""
        stream = self._h2.streams.get(stream_id)
        if stream is not None and not stream.closed:
            self._h2.reset_stream(stream_id, h2.errors.ErrorCodes.NO_ERROR)

    def _on_window(self, stream_id: int) -> None:
        if stream_id:
            call = self._calls.get(stream_id)
            if call is not None:
                self._pump(call)
            return
        for call in list(self._calls.values()):
            if call.outgoing:
                self._pump(call)

    def _pump(self, call: Call) -> None:
        """Send what the peer's windows allow of the call's queued bytes, then its trailers."""
        h2c = self._h2
        stream_id = call.stream_id
        outgoing = call.outgoing
        try:
            if not call.headers_sent and (outgoing or call.trailers):
                h2c.send_headers(stream_id, RESPONSE_HEADERS)
                call.headers_sent = True
                self._data_sent()
            if outgoing:
                self._data_sent()
            while outgoing:
                window = h2c.local_flow_control_window(stream_id)
                if window <= 0:
                    break
                first = outgoing[0]
                size = min(window, h2c.max_outbound_frame_size, len(first) - call.offset)
                if call.offset == 0 and size == len(first):
                    h2c.send_data(stream_id, first)
                    outgoing.popleft()
                else:
                    h2c.send_data(stream_id, first[call.offset : call.offset + size])
                    call.offset += size
                    if call.offset == len(first):
                        outgoing.popleft()
                        call.offset = 0
            if not outgoing and call.trailers:
                h2c.send_headers(stream_id, call.trailers, end_stream=True)
                self._stop_reading(stream_id)
                call.trailers = []
                if self._calls.pop(stream_id, None) is not None:
                    call.finished()
        except h2.exceptions.StreamClosedError:
            self._calls.pop(stream_id, None)
            self._abandon(call)
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

    def _data_sent(self) -> None:
        """Headers or data go out: the ping policy starts over (grpc core's rule: a client's
        pings count against it only while the server sends nothing)."""
        self._pings_without_data = 0
        self._ping_strikes = 0
        self._last_ping_received = None

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

    # ---- keepalive, ping policy, age, going away -----------------------------------------

    def _schedule_ping(self) -> None:
        if self._limits.keepalive_time_s < 2**31 / 1000:
            self._ping_due = self._loop.call_later(self._limits.keepalive_time_s, self._ping)

    def _ping(self) -> None:
        limits = self._limits
        if self._pings_unanswered:
            log.debug("gRPC connection from %s: keepalive ping unanswered", self.peer)
            self._close()
            return
        allowed = self._calls or limits.permit_without_calls
        limit = limits.max_pings_without_data
        if allowed and (limit == 0 or self._pings_without_data < limit):
            self._h2.ping(os.urandom(8))
            self._pings_unanswered += 1
            self._pings_without_data += 1
            self._flush()
            self._ping_deadline = self._loop.call_later(limits.keepalive_timeout_s, self._ping_late)
        self._schedule_ping()

    def _ping_late(self) -> None:
        if self._pings_unanswered:
            log.debug("gRPC connection from %s: keepalive ping timed out", self.peer)
            self._close()

    def _on_ping(self) -> None:
        """grpc core's ping policy: pings closer together than allowed while no data flows
        are strikes; past the limit the connection gets GOAWAY ENHANCE_YOUR_CALM."""
        limits = self._limits
        now = time.monotonic()
        if self._calls or limits.permit_without_calls:
            interval = limits.min_ping_interval_s
        else:
            interval = _NO_CALLS_PING_INTERVAL_S
        last, self._last_ping_received = self._last_ping_received, now
        if last is None or now - last >= interval:
            return
        self._ping_strikes += 1
        if self._ping_strikes > limits.max_ping_strikes > 0:
            self._h2.close_connection(
                error_code=h2.errors.ErrorCodes.ENHANCE_YOUR_CALM, additional_data=b"too_many_pings"
            )
            self._flush()
            self._close()

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
        self._flush()
        frame = GoAwayFrame(0, last_stream_id=self._h2.highest_inbound_stream_id, error_code=0)
        self._transport.write(frame.serialize())
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
