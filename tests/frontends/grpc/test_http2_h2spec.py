"""h2spec's cases that its plain requests cannot show on a gRPC server (a gRPC server answers
them with trailers only, no DATA), or that it failed before they were fixed, in process against
the framing. docs/reliability.md maps h2spec's sections to these tests."""

from __future__ import annotations

import hpack

from oceanus.frontends.grpc_transport import framing, wire
from tests.frontends.grpc.http2_frames import (
    MESSAGE,
    REQUEST,
    error_of,
    frames_of,
    opened,
    raw_frame,
    window_update,
)

PROTOCOL_ERROR = (wire.PROTOCOL_ERROR).to_bytes(4, "big")


def _resets(conn: framing.Http2) -> list[tuple[int, bytes]]:
    return [
        (stream, payload)
        for kind, _, stream, payload in frames_of(conn.data_to_send())
        if kind == 3
    ]


def test_generic_2_window_update_and_priority_on_a_half_closed_stream_are_accepted() -> None:
    """h2spec generic 2.2, 2.3 (it waits for DATA: a gRPC answer to its empty request has none)."""
    conn, recorder = opened()
    conn.receive(
        raw_frame(1, 0x4, 1, hpack.Encoder().encode(REQUEST)) + raw_frame(0, 0x1, 1, MESSAGE)
    )
    assert recorder.events[-1] == ("end", 1)
    conn.receive(window_update(1, 100) + raw_frame(2, 0, 1, bytes(5)))
    assert _resets(conn) == []
    assert conn.streams[1].send_window == 65535 + 100
    conn.send_data(1, b"answer")  # the stream still takes our answer
    conn.end_stream(1, [(b"grpc-status", b"0")])
    assert [kind for kind, *_ in frames_of(conn.data_to_send())] == [0, 1]


def test_4_2_3_a_frame_past_our_max_frame_size_is_a_frame_size_error() -> None:
    """h2spec 4.2.3: we announce RFC 9113's (and grpc core's) 16,384, not 1 MiB."""
    conn, _ = opened()
    block = hpack.Encoder().encode([*REQUEST, (b"x-dummy", b"x" * 20_000)], huffman=False)
    assert error_of(conn, raw_frame(1, 0x5, 1, block)) == wire.FRAME_SIZE_ERROR


def test_5_3_1_a_stream_that_depends_on_itself_is_a_stream_error() -> None:
    """h2spec 5.3.1.1 (HEADERS) and 5.3.1.2 (PRIORITY)."""
    encoder = hpack.Encoder()
    conn, recorder = opened()
    priority = (1).to_bytes(4, "big") + b"\x10"  # depends on stream 1, weight 16
    conn.receive(raw_frame(1, 0x25, 1, priority + encoder.encode(REQUEST)))
    assert _resets(conn) == [(1, PROTOCOL_ERROR)]
    assert not any(event[0] == "request" for event in recorder.events)
    conn.receive(raw_frame(1, 0x4, 3, encoder.encode(REQUEST)))  # the HPACK table still holds
    conn.receive(raw_frame(2, 0, 3, (3).to_bytes(4, "big") + b"\x10"))
    assert _resets(conn) == [(3, PROTOCOL_ERROR)]
    assert recorder.events[-1] == ("reset", 3)
    conn.receive(raw_frame(2, 0, 5, (1).to_bytes(4, "big") + b"\x10"))  # on another: ignored
    assert _resets(conn) == []


def test_8_1_2_6_data_unlike_content_length_is_a_stream_error() -> None:
    """h2spec 8.1.2.6.1 (one DATA frame) and 8.1.2.6.2 (several); the same length passes."""
    encoder = hpack.Encoder()
    conn, recorder = opened()
    said = [*REQUEST, (b"content-length", b"%d" % len(MESSAGE))]
    conn.receive(raw_frame(1, 0x4, 1, encoder.encode(said)) + raw_frame(0, 0x1, 1, MESSAGE))
    assert recorder.events[-1] == ("end", 1)
    longer = [*REQUEST, (b"content-length", b"%d" % (len(MESSAGE) + 1))]
    conn.receive(raw_frame(1, 0x4, 3, encoder.encode(longer)) + raw_frame(0, 0x1, 3, MESSAGE))
    assert _resets(conn) == [(3, PROTOCOL_ERROR)]
    assert recorder.events[-1] == ("reset", 3)
    halves = raw_frame(0, 0, 5, MESSAGE[:5]) + raw_frame(0, 0, 5, MESSAGE[5:])
    conn.receive(raw_frame(1, 0x4, 5, encoder.encode(said)) + halves + raw_frame(0, 0x1, 5, b"x"))
    assert _resets(conn) == [(5, PROTOCOL_ERROR)]
    # a content-length and no DATA at all, and one that is not a number: refused
    conn.receive(raw_frame(1, 0x5, 7, encoder.encode(said)))
    assert _resets(conn) == [(7, PROTOCOL_ERROR)]
    bad = [*REQUEST, (b"content-length", b"ten")]
    conn.receive(raw_frame(1, 0x5, 9, encoder.encode(bad)))
    assert _resets(conn) == [(9, PROTOCOL_ERROR)]
