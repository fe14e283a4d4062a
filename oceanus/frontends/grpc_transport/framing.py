"""HTTP/2 framing for a gRPC server (RFC 9113), header compression left to `hpack`.

Only what a gRPC server needs: client streams, no push, no priorities (parsed, checked and
ignored), flow control both ways (flow.py). Events go straight to the connection's methods
(events.py), not event objects: the general `h2` state machine was most of a gRPC request's
cost beside the servicer's (bench/grpc_transport_cost.py measures both).

Errors: a connection error raises `ConnectionError_`; the caller sends `goaway(code)` and
closes. A stream error resets that stream (RST_STREAM) and tells the connection it is gone.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import hpack

from oceanus.frontends.grpc_transport import defences, wire
from oceanus.frontends.grpc_transport.defences import MAX_HEADER_BLOCK, FloodBudget
from oceanus.frontends.grpc_transport.events import ConnectionError_ as ConnectionError_
from oceanus.frontends.grpc_transport.events import Events
from oceanus.frontends.grpc_transport.flow import WINDOW, Inflow, Stream
from oceanus.frontends.grpc_transport.headers import HeaderCodec, refusal

# Streams we reset while the client may still be sending on them: frames arriving there are
# ignored (RFC 9113 5.1, "closed"); the oldest are forgotten past this many.
_RESET_MEMORY = 1024

_SELF_DEPENDENT = 0x100  # not a wire flag: a header block whose priority names its own stream


class Http2:
    """One server connection's HTTP/2 state: `receive` bytes in, `data_to_send` bytes out."""

    def __init__(
        self,
        events: Events,
        max_streams: int = defences.MAX_STREAMS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._events = events
        self.max_streams = max_streams
        self._flood = FloodBudget(clock)
        self.streams: dict[int, Stream] = {}
        self.last_stream_id = 0  # the highest client stream id seen
        self._reset: dict[int, None] = {}  # streams we reset, oldest first
        self._out: list[bytes] = []
        self._buffer = bytearray()
        self._need = len(wire.PREFACE)  # bytes the buffer must hold before anything is parsed
        self._preface = False
        self._settings_seen = False
        self._send_window = wire.DEFAULT_WINDOW
        self._initial_window = wire.DEFAULT_WINDOW
        self.max_send_frame = 16384
        self._inflow = Inflow()  # the connection's receive window, refilled by `consumed`
        # A header block still being received (HEADERS without END_HEADERS, CONTINUATIONs)
        self._block_stream = 0
        self._block_flags = 0
        self._block: list[bytes] = []
        self._block_size = 0
        self._codec = HeaderCodec()

    # ---- out ----------------------------------------------------------------------------

    def initiate(self) -> None:
        """Our SETTINGS and the connection window's growth, the server's preface."""
        self._out.append(wire.frame(wire.SETTINGS, 0, 0, wire.our_settings(self.max_streams)))
        self._out.append(wire.window_update(0, (WINDOW - wire.DEFAULT_WINDOW)))

    def data_to_send(self) -> bytes:
        out = self._out
        if not out:
            return b""
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        return data

    def window(self, stream_id: int) -> int:
        """How many bytes of DATA the peer takes now on the stream (0 when it is gone)."""
        stream = self.streams.get(stream_id)
        return 0 if stream is None else min(self._send_window, stream.send_window)

    def send_headers(self, stream_id: int, headers: list[tuple[bytes, bytes]]) -> None:
        self._send_block(stream_id, self._codec.encode(headers), 0)

    def consumed(self, stream_id: int, size: int) -> None:
        """The application has taken (or dropped) `size` bytes of the stream's DATA: the peer
        gets them back, for the connection and the stream, half a window at a time."""
        inflow = self._inflow
        if inflow.consumed + size < WINDOW // 2:  # the common case, without a call
            inflow.consumed += size
        else:
            increment = inflow.give_back(size)
            self._out.append(wire.window_update(0, increment))
        stream = self.streams.get(stream_id)  # once the client ended it, it sends no more there
        increment = stream.give_back(size) if stream is not None and stream.remote_open else 0
        if increment:
            self._out.append(wire.window_update(stream_id, increment))

    def send_data(self, stream_id: int, data: bytes) -> None:
        """DATA within `window(stream_id)` and `max_send_frame`, as the caller has checked."""
        self.streams[stream_id].send_window -= len(data)
        self._send_window -= len(data)
        length = len(data)
        self._out.append(wire.HEAD.pack(length >> 8, length & 0xFF, wire.DATA, 0, stream_id))
        self._out.append(data)

    def end_stream(self, stream_id: int, trailers: list[tuple[bytes, bytes]]) -> None:
        """Our last frame on the stream. A client still sending is told to stop with
        RST_STREAM NO_ERROR (RFC 9113 8.1), as grpc servers do."""
        stream = self.streams.pop(stream_id, None)
        if stream is None:
            return
        self._send_block(stream_id, self._codec.encode(trailers), wire.END_STREAM)
        if stream.remote_open:
            self._send_reset(stream_id, wire.NO_ERROR)

    def reset(self, stream_id: int, code: int) -> None:
        if self.streams.pop(stream_id, None) is not None:
            self._send_reset(stream_id, code)

    def ping(self, data: bytes) -> None:
        self._out.append(wire.frame(wire.PING, 0, 0, data))

    def goaway(self, code: int, debug: bytes = b"") -> None:
        payload = self.last_stream_id.to_bytes(4, "big") + code.to_bytes(4, "big") + debug
        self._out.append(wire.frame(wire.GOAWAY, 0, 0, payload))

    def _send_reset(self, stream_id: int, code: int) -> None:
        self._out.append(wire.frame(wire.RST_STREAM, 0, stream_id, code.to_bytes(4, "big")))
        reset = self._reset
        reset[stream_id] = None
        if len(reset) > _RESET_MEMORY:
            del reset[next(iter(reset))]

    def _send_block(self, stream_id: int, block: bytes, flags: int) -> None:
        size = self.max_send_frame
        if len(block) <= size:
            self._out.append(wire.frame(wire.HEADERS, flags | wire.END_HEADERS, stream_id, block))
            return
        chunks = [block[i : i + size] for i in range(0, len(block), size)]
        self._out.append(wire.frame(wire.HEADERS, flags, stream_id, chunks[0]))
        for chunk in chunks[1:-1]:
            self._out.append(wire.frame(wire.CONTINUATION, 0, stream_id, chunk))
        self._out.append(wire.frame(wire.CONTINUATION, wire.END_HEADERS, stream_id, chunks[-1]))

    # ---- in -----------------------------------------------------------------------------

    @property
    def pending(self) -> bool:
        """Whole frames wait past a turn's budget: `receive(b"")` on a later turn, reading no
        more from the peer meanwhile."""
        return len(self._buffer) >= self._need

    def receive(self, data: bytes, budget: int = defences.FRAMES_PER_TURN) -> None:
        """Parse what arrived, at most `budget` frames; events fire as frames complete.
        Raises ConnectionError_."""
        buffer = self._buffer
        if buffer:
            buffer += data
            if len(buffer) < self._need:
                return
            data = bytes(buffer)
            buffer.clear()
        elif len(data) < self._need:
            if not self._preface:
                self._check_preface(data)
            buffer += data
            return
        pos = 0
        if not self._preface:
            self._check_preface(data)
            self._preface = True
            pos = len(wire.PREFACE)
        end = len(data)
        unpack = wire.HEAD.unpack_from
        while end - pos >= 9:
            if budget <= 0:
                self._need = 9
                break
            high, low, kind, flags, stream_id = unpack(data, pos)
            length = high << 8 | low
            # a frame is a unit; a header block costs one more per 16 bytes (HPACK decoding)
            budget -= 1 + (length >> 4 if kind in (wire.HEADERS, wire.CONTINUATION) else 0)
            if length > wire.MAX_FRAME:
                raise ConnectionError_(wire.FRAME_SIZE_ERROR, f"frame of {length} bytes")
            if end - pos - 9 < length:
                self._need = 9 + length
                break
            start = pos + 9
            pos = start + length
            self._frame(kind, flags, stream_id & wire.MAX_WINDOW, data[start:pos])
        else:
            self._need = 9
        if pos < end:
            buffer += data[pos:] if pos else data

    def _check_preface(self, data: bytes) -> None:
        if not wire.PREFACE.startswith(data[: len(wire.PREFACE)]):
            raise ConnectionError_(wire.PROTOCOL_ERROR, "not the HTTP/2 connection preface")

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._block_stream and kind != wire.CONTINUATION:
            raise ConnectionError_(wire.PROTOCOL_ERROR, "a header block interrupted")
        if not self._settings_seen:
            if kind != wire.SETTINGS or flags & wire.ACK:
                raise ConnectionError_(wire.PROTOCOL_ERROR, "the preface's SETTINGS missing")
            self._settings_seen = True
        if kind == wire.DATA:
            if payload and (len(payload) > 1 or not flags & wire.PADDED):
                self._flood.useful_frames += 1
            elif not flags & wire.END_STREAM:
                self._idle()
            self._on_data(flags, stream_id, payload)
            return
        if kind != wire.HEADERS:
            self._idle()
        if kind == wire.HEADERS:
            self._on_headers(flags, stream_id, payload)
        elif kind == wire.CONTINUATION:
            self._on_continuation(flags, stream_id, payload)
        elif kind == wire.WINDOW_UPDATE:
            self._on_window_update(stream_id, payload)
        elif kind == wire.SETTINGS:
            self._on_settings(flags, stream_id, payload)
        elif kind == wire.PING:
            if stream_id:
                raise ConnectionError_(wire.PROTOCOL_ERROR, "PING on a stream")
            if len(payload) != 8:
                raise ConnectionError_(wire.FRAME_SIZE_ERROR, "PING not of 8 bytes")
            if flags & wire.ACK:
                self._events.on_ping_ack()
            else:
                self._out.append(wire.frame(wire.PING, wire.ACK, 0, payload))
                self._events.on_ping()
        elif kind == wire.RST_STREAM:
            if not stream_id or stream_id > self.last_stream_id:
                raise ConnectionError_(wire.PROTOCOL_ERROR, "RST_STREAM on an idle stream")
            if len(payload) != 4:
                raise ConnectionError_(wire.FRAME_SIZE_ERROR, "RST_STREAM not of 4 bytes")
            if self.streams.pop(stream_id, None) is not None:
                if not self._flood.spend_reset():
                    raise ConnectionError_(wire.ENHANCE_YOUR_CALM, "too many streams reset")
                self._events.on_reset(stream_id)
        elif kind == wire.PRIORITY:
            if not stream_id:
                raise ConnectionError_(wire.PROTOCOL_ERROR, "PRIORITY on stream 0")
            if len(payload) != 5:
                self._stream_error(stream_id, wire.FRAME_SIZE_ERROR)
            elif int.from_bytes(payload[:4], "big") & wire.MAX_WINDOW == stream_id:
                self._stream_error(stream_id, wire.PROTOCOL_ERROR)  # depends on itself (5.3.1)
        elif kind == wire.GOAWAY:
            if stream_id:
                raise ConnectionError_(wire.PROTOCOL_ERROR, "GOAWAY on a stream")
            self._events.on_goaway()
        elif kind == wire.PUSH_PROMISE:
            raise ConnectionError_(wire.PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        # other types are extensions: ignored (RFC 9113 4.1)

    def _refuse(self, stream_id: int, text: str) -> None:
        """A malformed request (RFC 9113 8.1.1): gRPC's INTERNAL with `text` for the client
        to read, as grpc core answers, then RST_STREAM PROTOCOL_ERROR, as RFC 9113 asks.
        Counted as a frame that does no work: a flood of them is told to calm down."""
        self._idle()
        self._send_block(stream_id, self._codec.encode(refusal(text)), wire.END_STREAM)
        self._send_reset(stream_id, wire.PROTOCOL_ERROR)

    def _idle(self) -> None:
        """A frame that did no work: past the window's allowance, the peer is told to calm down."""
        flood = self._flood
        if flood.idle_frames < defences.FLOOD_FRAMES:  # the common case, without a call
            flood.idle_frames += 1
        elif not flood.spend_idle():
            raise ConnectionError_(wire.ENHANCE_YOUR_CALM, "too many frames that do no work")

    def _stream_error(self, stream_id: int, code: int) -> None:
        """RFC 9113 5.4.2: reset the stream; its call is gone as if the client reset it."""
        had = self.streams.pop(stream_id, None)
        self._send_reset(stream_id, code)
        if had is not None:
            self._events.on_reset(stream_id)

    def _strip_padding(self, flags: int, payload: bytes) -> bytes:
        if not flags & wire.PADDED:
            return payload
        if not payload or payload[0] >= len(payload):
            raise ConnectionError_(wire.PROTOCOL_ERROR, "padding as long as the frame")
        return payload[1 : len(payload) - payload[0]]

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise ConnectionError_(wire.PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)  # padding counts against the windows too
        inflow = self._inflow  # (Inflow's arithmetic inline: this runs for every DATA frame)
        inflow.received += size
        if inflow.received > WINDOW:
            raise ConnectionError_(wire.FLOW_CONTROL_ERROR, "DATA past the connection window")
        data = self._strip_padding(flags, payload) if flags & wire.PADDED else payload
        stream = self.streams.get(stream_id)
        if stream is not None and stream.remote_open:
            stream.received += size
        if stream is None or not stream.remote_open or stream.received > WINDOW:
            if stream is None and stream_id > self.last_stream_id:
                raise ConnectionError_(wire.PROTOCOL_ERROR, "DATA on an idle stream")
            if stream is not None and stream.remote_open:
                self._stream_error(stream_id, wire.FLOW_CONTROL_ERROR)
            elif stream is not None or stream_id not in self._reset:
                self._stream_error(stream_id, wire.STREAM_CLOSED)
            self.consumed(0, size)  # dropped: nobody holds these bytes
            return
        if stream.length >= 0:  # RFC 9113 8.1.1: DATA unlike content-length is malformed
            stream.length -= len(data)
            if stream.length < 0 or (flags & wire.END_STREAM and stream.length):
                self._stream_error(stream_id, wire.PROTOCOL_ERROR)
                self.consumed(0, size)
                return
        if flags & wire.END_STREAM:
            stream.remote_open = False
        if len(data) < size:
            self.consumed(stream_id, size - len(data))  # the padding
        if data:
            self._events.on_data(stream_id, data)
        if flags & wire.END_STREAM and stream_id in self.streams:
            self._events.on_end(stream_id)

    def _on_headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id or not stream_id & 1:
            raise ConnectionError_(wire.PROTOCOL_ERROR, f"HEADERS on stream {stream_id}")
        block = self._strip_padding(flags, payload)
        if flags & wire.PRIORITY_FLAG:
            if len(block) < 5:
                raise ConnectionError_(wire.FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            if int.from_bytes(block[:4], "big") & wire.MAX_WINDOW == stream_id:
                flags |= _SELF_DEPENDENT
            block = block[5:]
        if flags & wire.END_HEADERS:
            if len(block) > MAX_HEADER_BLOCK:
                raise ConnectionError_(wire.ENHANCE_YOUR_CALM, "header block over the limit")
            self._on_block(flags, stream_id, block)
            return
        self._block_stream = stream_id
        self._block_flags = flags
        self._block = [block]
        self._block_size = len(block)

    def _on_continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not self._block_stream or stream_id != self._block_stream:
            raise ConnectionError_(wire.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        self._block.append(payload)
        self._block_size += len(payload)
        if self._block_size > MAX_HEADER_BLOCK or len(self._block) > defences.MAX_CONTINUATIONS:
            raise ConnectionError_(wire.ENHANCE_YOUR_CALM, "header block over the limit")
        if flags & wire.END_HEADERS:
            block = b"".join(self._block)
            self._block_stream = 0
            self._block = []
            self._on_block(self._block_flags, stream_id, block)

    def _decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        try:
            return self._codec.decode(block)
        except hpack.OversizedHeaderListError as exc:
            raise ConnectionError_(wire.ENHANCE_YOUR_CALM, f"header list too long: {exc}") from None
        except (hpack.HPACKError, IndexError, ValueError) as exc:
            raise ConnectionError_(wire.COMPRESSION_ERROR, f"HPACK: {exc}") from None

    def _on_block(self, flags: int, stream_id: int, block: bytes) -> None:
        # Decoded whatever becomes of the stream: the HPACK table is the connection's.
        headers = self._decode(block)
        stream = self.streams.get(stream_id)
        if flags & _SELF_DEPENDENT:  # a stream that depends on itself (RFC 9113 5.3.1)
            self.last_stream_id = max(self.last_stream_id, stream_id)
            self._idle()
            self._stream_error(stream_id, wire.PROTOCOL_ERROR)
            return
        if stream is None:
            if stream_id <= self.last_stream_id:
                if stream_id in self._reset:
                    return  # trailers of a stream we reset
                raise ConnectionError_(wire.PROTOCOL_ERROR, f"stream id {stream_id} reused")
            self.last_stream_id = stream_id
            if len(self.streams) >= self.max_streams:
                self._idle()
                self._send_reset(stream_id, wire.REFUSED_STREAM)
                return
            malformed = self._codec.malformed(headers)
            if malformed is not None:
                self._refuse(stream_id, malformed)
                return
            length = self._codec.content_length
            if flags & wire.END_STREAM and length > 0:  # RFC 9113 8.1.1: DATA unlike content-length
                self._refuse(stream_id, "content-length without its DATA")
                return
            stream = self.streams[stream_id] = Stream(self._initial_window, length)
            if flags & wire.END_STREAM:
                stream.remote_open = False
            self._events.on_request(stream_id, headers)
        elif not stream.remote_open:
            self._stream_error(stream_id, wire.STREAM_CLOSED)
            return
        elif not flags & wire.END_STREAM or any(key[:1] == b":" for key, _ in headers):
            # trailers must end the stream, and carry no pseudo-header (RFC 9113 8.1)
            self._stream_error(stream_id, wire.PROTOCOL_ERROR)
            return
        elif stream.length > 0:
            self._stream_error(stream_id, wire.PROTOCOL_ERROR)  # ended short of its content-length
            return
        else:
            stream.remote_open = False
        if flags & wire.END_STREAM and stream_id in self.streams:
            self._events.on_end(stream_id)

    def _on_window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionError_(wire.FRAME_SIZE_ERROR, "WINDOW_UPDATE not of 4 bytes")
        increment = int.from_bytes(payload, "big") & wire.MAX_WINDOW
        if not stream_id:
            if not increment:
                raise ConnectionError_(wire.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > wire.MAX_WINDOW:
                raise ConnectionError_(wire.FLOW_CONTROL_ERROR, "connection window past 2^31-1")
            self._events.on_window(0)
            return
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id > self.last_stream_id:
                raise ConnectionError_(wire.PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
            return  # a stream that has ended: ignored
        if not increment:
            self._stream_error(stream_id, wire.PROTOCOL_ERROR)
            return
        stream.send_window += increment
        if stream.send_window > wire.MAX_WINDOW:
            self._stream_error(stream_id, wire.FLOW_CONTROL_ERROR)
            return
        self._events.on_window(stream_id)

    def _on_settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise ConnectionError_(wire.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & wire.ACK:
            if payload:
                raise ConnectionError_(wire.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise ConnectionError_(wire.FRAME_SIZE_ERROR, "SETTINGS not a multiple of 6 bytes")
        grew = False
        for offset in range(0, len(payload), 6):
            key, value = wire.SETTING.unpack_from(payload, offset)
            if key == wire.INITIAL_WINDOW_SIZE:
                if value > wire.MAX_WINDOW:
                    raise ConnectionError_(
                        wire.FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE past 2^31-1"
                    )
                delta = value - self._initial_window
                self._initial_window = value
                grew = grew or delta > 0
                for stream in self.streams.values() if delta else ():
                    stream.send_window += delta
                    if stream.send_window > wire.MAX_WINDOW:
                        raise ConnectionError_(
                            wire.FLOW_CONTROL_ERROR, "a stream window past 2^31-1"
                        )
            elif key == wire.MAX_FRAME_SIZE:
                if not 16384 <= value <= 2**24 - 1:
                    raise ConnectionError_(wire.PROTOCOL_ERROR, f"MAX_FRAME_SIZE {value}")
                self.max_send_frame = value
            elif key == wire.HEADER_TABLE_SIZE:
                self._codec.set_table_size(value)
            elif key == wire.ENABLE_PUSH and value > 1:
                raise ConnectionError_(wire.PROTOCOL_ERROR, f"ENABLE_PUSH {value}")
        self._out.append(wire.frame(wire.SETTINGS, wire.ACK, 0))
        if grew:
            self._events.on_window(0)
