"""Raw HTTP/2 frames and a recording peer for the in-process framing tests."""

from __future__ import annotations

import struct
from typing import Any

import hpack
import pytest

from oceanus.frontends.grpc_transport.framing import ConnectionError_, Http2

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
REQUEST = [
    (b":method", b"POST"),
    (b":scheme", b"http"),
    (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
    (b":authority", b"localhost"),
    (b"content-type", b"application/grpc"),
    (b"te", b"trailers"),
]
MESSAGE = b"\0" + (10).to_bytes(4, "big") + b"0123456789"


def raw_frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """A frame as RFC 9113 4.1 lays it out, built here independently of wire.frame."""
    return len(payload).to_bytes(3, "big") + struct.pack(">BBL", kind, flags, stream_id) + payload


def settings(**values: int) -> bytes:
    codes = {"header_table_size": 1, "initial_window_size": 4, "max_frame_size": 5}
    payload = b"".join(struct.pack(">HL", codes[k], v) for k, v in values.items())
    return raw_frame(4, 0, 0, payload)


def window_update(stream_id: int, increment: int) -> bytes:
    return raw_frame(8, 0, stream_id, increment.to_bytes(4, "big"))


def frames_of(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream id, payload) of each frame the server wrote."""
    found = []
    pos = 0
    while pos < len(data):
        length = int.from_bytes(data[pos : pos + 3], "big")
        kind, flags, stream_id = struct.unpack_from(">BBL", data, pos + 3)
        found.append((kind, flags, stream_id, data[pos + 9 : pos + 9 + length]))
        pos += 9 + length
    return found


class Recorder:
    """The connection's side of events.Events, writing down what it is told."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def on_request(self, stream_id: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.events.append(("request", stream_id, list(headers)))

    def on_data(self, stream_id: int, data: bytes) -> None:
        self.events.append(("data", stream_id, data))

    def on_end(self, stream_id: int) -> None:
        self.events.append(("end", stream_id))

    def on_reset(self, stream_id: int) -> None:
        self.events.append(("reset", stream_id))

    def on_window(self, stream_id: int) -> None:
        self.events.append(("window", stream_id))

    def on_ping(self) -> None:
        self.events.append(("ping",))

    def on_ping_ack(self) -> None:
        self.events.append(("ping_ack",))

    def on_goaway(self) -> None:
        self.events.append(("goaway",))


def server() -> tuple[Http2, Recorder]:
    recorder = Recorder()
    conn = Http2(recorder)
    conn.initiate()
    conn.data_to_send()
    return conn, recorder


def opened(**values: int) -> tuple[Http2, Recorder]:
    """A server past the client's preface and SETTINGS, their ACK read."""
    conn, recorder = server()
    conn.receive(PREFACE + settings(**values))
    conn.data_to_send()
    recorder.events.clear()
    return conn, recorder


def error_of(conn: Http2, data: bytes) -> int:
    with pytest.raises(ConnectionError_) as caught:
        conn.receive(data)
        while conn.pending:  # frames past a turn's budget, as the connection's next turns
            conn.receive(b"")
    return caught.value.code


def one_call(encoder: hpack.Encoder, stream_id: int = 1) -> bytes:
    return raw_frame(1, 0x4, stream_id, encoder.encode(REQUEST)) + raw_frame(
        0, 0x1, stream_id, MESSAGE
    )
