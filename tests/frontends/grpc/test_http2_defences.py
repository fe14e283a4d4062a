"""The framing's defences in process: malformed requests refused in grpc core's words, floods
of frames that do no work, rapid reset, the stream limit and the per-turn budget."""

from __future__ import annotations

import struct
from typing import Any

import hpack
import pytest

from oceanus.frontends.grpc_transport import defences, wire
from oceanus.frontends.grpc_transport.framing import Http2
from tests.frontends.grpc.http2_frames import (
    MESSAGE,
    PREFACE,
    REQUEST,
    Recorder,
    error_of,
    frames_of,
    one_call,
    opened,
    raw_frame,
    settings,
    window_update,
)


def _refused(headers: list[tuple[bytes, bytes]], end_stream: bool = True) -> tuple[Any, ...]:
    """What the server sends for a request with `headers`: the frames, the events."""
    conn, recorder = opened()
    flags = 0x4 | (0x1 if end_stream else 0)
    conn.receive(raw_frame(1, flags, 1, hpack.Encoder().encode(headers)))
    return frames_of(conn.data_to_send()), recorder.events


def _without(name: bytes) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in REQUEST if k != name]


MALFORMED = {
    "upper case name": ([*REQUEST, (b"X-Up", b"1")], "Illegal header key: X-Up"),
    "unknown pseudo-header": ([*REQUEST, (b":foo", b"1")], "Illegal header key: :foo"),
    "response pseudo-header": ([*REQUEST, (b":status", b"200")], "Illegal header key: :status"),
    "pseudo-header after a field": (
        [*_without(b":authority"), (b":authority", b"x")],
        "Pseudo-header ':authority' after regular headers",
    ),
    "duplicate pseudo-header": (
        [(b":path", b"/a"), *REQUEST],
        "Duplicate ':path' header received",
    ),
    "connection-specific field": (
        [*REQUEST, (b"connection", b"keep-alive")],
        "Connection-specific header 'connection'",
    ),
    "te other than trailers": (
        [*_without(b"te"), (b"te", b"gzip")],
        "Error parsing 'te' metadata",
    ),
    "no :method": (_without(b":method"), "Missing ':method' header"),
    "no :scheme": (_without(b":scheme"), "Missing ':scheme' header"),
    "no :path": (_without(b":path"), "Missing ':path' header"),
    "empty :path": (
        [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"")],
        "Empty ':path' header",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
@pytest.mark.parametrize("end_stream", [True, False])
def test_malformed_requests_are_refused_in_grpc_words_then_reset(
    case: str, end_stream: bool
) -> None:
    headers, words = MALFORMED[case]
    sent, events = _refused(headers, end_stream)
    assert events == []  # the connection never hears of the call
    (kind, flags, stream, block), reset = sent
    assert (kind, flags & 0x5, stream) == (1, 0x5, 1)
    answer = dict(hpack.Decoder().decode(block, raw=True))
    assert answer[b"grpc-status"] == b"13"
    assert answer[b"grpc-message"].decode() == words
    assert reset == (3, 0, 1, wire.PROTOCOL_ERROR.to_bytes(4, "big"))


def test_a_refused_streams_data_is_ignored_and_the_next_call_served() -> None:
    conn, recorder = opened()
    encoder = hpack.Encoder()
    conn.receive(raw_frame(1, 0x4, 1, encoder.encode([*REQUEST, (b"X", b"1")])))
    conn.receive(raw_frame(0, 0x1, 1, MESSAGE))
    conn.receive(one_call(encoder, 3))
    assert [event[0] for event in recorder.events] == ["request", "data", "end"]


def test_trailers_with_a_pseudo_header_reset_the_stream() -> None:
    conn, recorder = opened()
    encoder = hpack.Encoder()
    conn.receive(raw_frame(1, 0x4, 1, encoder.encode(REQUEST)))
    conn.data_to_send()
    conn.receive(raw_frame(1, 0x5, 1, encoder.encode([(b":path", b"/x")])))
    assert frames_of(conn.data_to_send()) == [(3, 0, 1, b"\0\0\0\1")]
    assert recorder.events[-1] == ("reset", 1)


# ---- floods, budgets, concurrency (CVE-2019-9512..9518, CVE-2023-44487; issue 42) ---------


def _calm(conn: Http2, data: bytes) -> None:
    assert error_of(conn, data) == wire.ENHANCE_YOUR_CALM


CONTROL_FLOODS = {
    "SETTINGS": raw_frame(4, 0, 0),
    "PING": raw_frame(6, 0, 0, b"12345678"),
    "WINDOW_UPDATE": window_update(0, 1),
    "PRIORITY": raw_frame(2, 0, 1, b"\0\0\0\0\x10"),
    "unknown type": raw_frame(0xAA, 0, 0, b"x"),
}


@pytest.mark.parametrize("kind", list(CONTROL_FLOODS))
def test_a_flood_of_frames_that_do_no_work_gets_enhance_your_calm(kind: str) -> None:
    conn, _ = opened()
    frame = CONTROL_FLOODS[kind]
    allowed = defences.FLOOD_FRAMES - 1  # the preface's SETTINGS counted one
    conn.receive(frame * allowed, budget=allowed)
    _calm(conn, frame * 10)


def test_empty_data_frames_are_counted_and_a_slow_trickle_is_not() -> None:
    now = [0.0]
    conn = Http2(Recorder(), clock=lambda: now[0])
    conn.initiate()
    conn.receive(PREFACE + settings())
    encoder = hpack.Encoder()
    conn.receive(raw_frame(1, 0x4, 1, encoder.encode(REQUEST)))
    empty = raw_frame(0, 0, 1)
    limit = defences.FLOOD_FRAMES
    conn.receive(empty * (limit - 1), budget=limit)  # the preface's SETTINGS counted one
    for _ in range(3):  # each window its allowance, as time passes
        now[0] += defences.FLOOD_WINDOW_S
        conn.receive(empty * limit, budget=limit)
    _calm(conn, empty * (limit + 1))  # more within one window


def test_rapid_reset_is_counted_against_the_connection() -> None:
    conn, _ = opened()
    encoder = hpack.Encoder()
    frames = b"".join(
        raw_frame(1, 0x4, 2 * n + 1, encoder.encode(REQUEST))
        + raw_frame(3, 0, 2 * n + 1, b"\0\0\0\x08")
        for n in range(defences.RESETS_PER_WINDOW)
    )
    conn.receive(frames, budget=10**6)
    n = defences.RESETS_PER_WINDOW
    _calm(
        conn,
        raw_frame(1, 0x4, 2 * n + 1, encoder.encode(REQUEST))
        + raw_frame(3, 0, 2 * n + 1, b"\0\0\0\x08"),
    )


def test_max_concurrent_streams_is_announced_and_enforced() -> None:
    recorder = Recorder()
    conn = Http2(recorder, max_streams=2)
    conn.initiate()
    announced = frames_of(conn.data_to_send())[0][3]
    assert struct.pack(">HL", 3, 2) in [announced[i : i + 6] for i in range(0, len(announced), 6)]
    conn.receive(PREFACE + settings())
    conn.data_to_send()
    encoder = hpack.Encoder()
    for stream_id in (1, 3, 5):
        conn.receive(raw_frame(1, 0x4, stream_id, encoder.encode(REQUEST)))
    assert [e[1] for e in recorder.events if e[0] == "request"] == [1, 3]
    assert frames_of(conn.data_to_send())[-1] == (3, 0, 5, b"\0\0\0\x07")  # REFUSED_STREAM
    conn.receive(raw_frame(0, 0x1, 5, MESSAGE))  # what it still sends there is ignored
    conn.end_stream(1, [(b"grpc-status", b"0")])
    conn.receive(raw_frame(1, 0x4, 7, encoder.encode(REQUEST)))
    assert [e[1] for e in recorder.events if e[0] == "request"] == [1, 3, 7]


def test_frames_past_a_turns_budget_wait_for_the_next_turn() -> None:
    conn, recorder = opened()
    encoder = hpack.Encoder()
    frames = b"".join(one_call(encoder, 2 * n + 1) for n in range(10))  # 20 frames
    conn.receive(frames, budget=5)
    assert conn.pending
    assert 0 < len(recorder.events) < 30
    while conn.pending:
        conn.receive(b"", budget=5)
    assert [e[1] for e in recorder.events if e[0] == "end"] == list(range(1, 21, 2))


def test_a_large_header_block_uses_more_of_a_turn() -> None:
    """HPACK decoding costs per byte: a block of 16 KiB (a whole frame) takes a turn's budget."""
    conn, recorder = opened()
    encoder = hpack.Encoder()
    big = encoder.encode([*REQUEST, (b"x-big", b"v" * (18 << 10))])
    assert 16000 < len(big) <= wire.MAX_FRAME
    frames = raw_frame(1, 0x5, 1, big) + one_call(encoder, 3)
    conn.receive(frames, budget=defences.FRAMES_PER_TURN)
    assert [e[:2] for e in recorder.events] == [("request", 1), ("end", 1)]
    assert conn.pending
    conn.receive(b"")
    assert [e[1] for e in recorder.events if e[0] == "end"] == [1, 3]


def test_settings_that_change_nothing_wake_no_call() -> None:
    conn, recorder = opened()
    conn.receive(raw_frame(1, 0x4, 1, hpack.Encoder().encode(REQUEST)))
    recorder.events.clear()
    conn.receive(settings(max_frame_size=16384) + settings(initial_window_size=65535))
    assert recorder.events == []
    conn.receive(settings(initial_window_size=70000))
    assert recorder.events == [("window", 0)]


def test_a_flood_of_malformed_requests_gets_enhance_your_calm() -> None:
    conn, _ = opened()
    encoder = hpack.Encoder()
    block = encoder.encode([*REQUEST, (b"X-Up", b"1")])
    allowed = defences.FLOOD_FRAMES - 1  # the preface's SETTINGS counted one
    conn.receive(b"".join(raw_frame(1, 0x5, 2 * n + 1, block) for n in range(allowed)), 10**6)
    _calm(conn, raw_frame(1, 0x5, 2 * allowed + 1, block))
