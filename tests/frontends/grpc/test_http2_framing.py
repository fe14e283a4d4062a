"""The gRPC transport's HTTP/2 framing (frontends/grpc_transport/framing.py), in process: frames
as a client sends them, cut anywhere, and each error with the code RFC 9113 names."""

from __future__ import annotations

import struct
import time

import hpack
import hypothesis
import pytest
from hypothesis import given
from hypothesis import strategies as st

from oceanus.frontends.grpc_transport import wire
from oceanus.frontends.grpc_transport.defences import MAX_HEADER_BLOCK
from oceanus.frontends.grpc_transport.framing import ConnectionError_, Http2
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
    server,
    settings,
    window_update,
)


def test_a_call_cut_at_every_byte_gives_the_same_events() -> None:
    encoder = hpack.Encoder()
    sent = PREFACE + settings(initial_window_size=1 << 20) + one_call(encoder)
    sent += one_call(encoder, 3)  # the second call's headers come from the dynamic table
    whole, recorded = server()
    whole.receive(sent)
    expected = recorded.events
    kinds = ["window", "request", "data", "end", "request", "data", "end"]
    assert [event[0] for event in expected] == kinds
    assert expected[1][2] == REQUEST and expected[4][2] == REQUEST
    assert expected[2][2] == MESSAGE
    for cut in range(1, len(sent)):
        conn, recorder = server()
        conn.receive(sent[:cut])
        conn.receive(sent[cut:])
        assert recorder.events == expected, cut
    conn, recorder = server()
    for byte in range(len(sent)):
        conn.receive(sent[byte : byte + 1])
    assert recorder.events == expected


def test_the_server_answers_settings_and_pings_and_ignores_priority_and_unknown_frames() -> None:
    conn, recorder = server()
    conn.receive(PREFACE + settings(max_frame_size=1 << 16))
    assert frames_of(conn.data_to_send()) == [(4, 0x1, 0, b"")]  # SETTINGS ACK
    assert conn.max_send_frame == 1 << 16
    conn.receive(raw_frame(6, 0, 0, b"12345678"))
    assert frames_of(conn.data_to_send()) == [(6, 0x1, 0, b"12345678")]
    conn.receive(raw_frame(2, 0, 5, bytes(5)) + raw_frame(0xEE, 0xFF, 7, b"whatever"))
    assert conn.data_to_send() == b""
    assert recorder.events == [("ping",)]  # no window grew: no call is woken
    assert error_of(conn, raw_frame(6, 0, 0, b"1234")) == wire.FRAME_SIZE_ERROR


def test_continuation_carries_a_header_block() -> None:
    conn, recorder = opened()
    block = hpack.Encoder().encode(REQUEST)
    conn.receive(
        raw_frame(1, 0x1, 1, block[:5])
        + raw_frame(9, 0, 1, block[5:9])
        + raw_frame(9, 0x4, 1, block[9:])
    )
    assert recorder.events == [("request", 1, REQUEST), ("end", 1)]


def test_a_header_block_interrupted_or_continued_out_of_place_is_a_protocol_error() -> None:
    block = hpack.Encoder().encode(REQUEST)
    conn, _ = opened()
    interrupted = raw_frame(1, 0, 1, block[:5]) + raw_frame(6, 0, 0, bytes(8))
    assert error_of(conn, interrupted) == wire.PROTOCOL_ERROR
    conn, _ = opened()
    assert error_of(conn, raw_frame(9, 0x4, 1, block)) == wire.PROTOCOL_ERROR


def test_padding_and_priority_are_taken_off_headers_and_data() -> None:
    conn, recorder = opened()
    block = hpack.Encoder().encode(REQUEST)
    padded = bytes((7,)) + bytes(5) + block + bytes(7)  # pad length, priority, block, padding
    conn.receive(
        raw_frame(1, 0x4 | 0x8 | 0x20, 1, padded)
        + raw_frame(0, 0x1 | 0x8, 1, bytes((3,)) + MESSAGE + b"pad")
    )
    assert recorder.events == [("request", 1, REQUEST), ("data", 1, MESSAGE), ("end", 1)]
    conn, _ = opened()
    too_much = raw_frame(1, 0x4 | 0x8, 1, bytes((len(block) + 1,)) + block)
    assert error_of(conn, too_much) == wire.PROTOCOL_ERROR


def test_a_frame_past_our_max_frame_size_is_refused_from_its_header() -> None:
    conn, _ = opened()
    head = raw_frame(0, 0, 1)[3:]
    assert error_of(conn, (wire.MAX_FRAME + 1).to_bytes(3, "big") + head) == (wire.FRAME_SIZE_ERROR)


@pytest.mark.parametrize(
    "sent", [b"GET / HTTP/1.1\r\n", b"PRI * HTTP/1.1", PREFACE + raw_frame(6, 0, 0, bytes(8))]
)
def test_a_bad_preface_is_a_protocol_error(sent: bytes) -> None:
    conn, _ = server()
    assert error_of(conn, sent) == wire.PROTOCOL_ERROR


def test_windows_past_2_31_are_flow_control_errors() -> None:
    conn, _ = opened()
    assert error_of(conn, window_update(0, 2**31 - 1)) == wire.FLOW_CONTROL_ERROR
    conn, _ = opened()
    too_big = raw_frame(4, 0, 0, struct.pack(">HL", 4, 2**31))
    assert error_of(conn, too_big) == wire.FLOW_CONTROL_ERROR
    # on a stream: a stream error, the call gone, the connection kept
    conn, recorder = opened()
    conn.receive(raw_frame(1, 0x4, 1, hpack.Encoder().encode(REQUEST)))
    conn.receive(window_update(1, 2**31 - 1))
    assert frames_of(conn.data_to_send()) == [(3, 0, 1, (3).to_bytes(4, "big"))]
    assert recorder.events[-1] == ("reset", 1)
    assert error_of(conn, window_update(0, 0)) == wire.PROTOCOL_ERROR


def test_window_updates_both_ways() -> None:
    conn, recorder = opened(initial_window_size=100)
    conn.receive(raw_frame(1, 0x4, 1, hpack.Encoder().encode(REQUEST)))
    assert conn.window(1) == 100
    conn.send_data(1, bytes(60))
    assert conn.window(1) == 40
    conn.receive(window_update(1, 10) + settings(initial_window_size=200))
    assert conn.window(1) == 150  # 40 + 10, and the new initial size's 100 more
    assert ("window", 1) in recorder.events
    conn.data_to_send()
    # receiving: nothing given back as DATA arrives, a WINDOW_UPDATE for the connection and
    # the stream once the application has consumed half a window
    chunk = raw_frame(0, 0, 1, bytes(wire.MAX_FRAME))
    for _ in range(wire.WINDOW // wire.MAX_FRAME):
        conn.receive(chunk)
    assert conn.data_to_send() == b""
    conn.consumed(1, wire.WINDOW // 2 - 1)
    assert conn.data_to_send() == b""
    conn.consumed(1, 1)
    sent = frames_of(conn.data_to_send())
    half = (wire.WINDOW // 2).to_bytes(4, "big")
    assert sent == [(8, 0, 0, half), (8, 0, 1, half)]


def test_data_past_the_window_is_a_flow_control_error() -> None:
    conn, _ = opened()
    conn.receive(raw_frame(1, 0x4, 1, hpack.Encoder().encode(REQUEST)))
    conn.receive(raw_frame(1, 0x4, 3, hpack.Encoder().encode(REQUEST)))
    conn._inflow.received = wire.WINDOW - 10  # as if the client had ignored our windows
    assert error_of(conn, raw_frame(0, 0, 3, bytes(11))) == wire.FLOW_CONTROL_ERROR


def test_a_header_block_over_the_limit_is_refused() -> None:
    big = hpack.Encoder().encode([*REQUEST, (b"x-huge", b"v" * (70 << 10))], huffman=False)
    conn, _ = opened()  # in one frame: past our SETTINGS_MAX_FRAME_SIZE first
    assert error_of(conn, raw_frame(1, 0x4, 1, big)) == wire.FRAME_SIZE_ERROR
    conn, _ = opened()
    pieces = raw_frame(1, 0, 1, big[:1000]) + b"".join(
        raw_frame(9, 0, 1, big[i : i + 16384]) for i in range(1000, len(big), 16384)
    )
    assert error_of(conn, pieces) == wire.ENHANCE_YOUR_CALM
    # small on the wire, a header list past 64 KiB once decoded (the hpack decoder's limit)
    conn, _ = opened()
    listed = hpack.Encoder().encode([*REQUEST, (b"x-big", b"v" * (64 << 10))], huffman=True)
    assert len(listed) < MAX_HEADER_BLOCK
    ends = range(16384, len(listed) + 16384, 16384)
    cut = raw_frame(1, 0, 1, listed[:16384]) + b"".join(
        raw_frame(9, 0x4 if end >= len(listed) else 0, 1, listed[end : end + 16384]) for end in ends
    )
    assert error_of(conn, cut) == wire.ENHANCE_YOUR_CALM
    # a CONTINUATION flood: empty frames that never end the block
    conn, _ = opened()
    flood = raw_frame(1, 0, 1, b"") + raw_frame(9, 0, 1, b"") * 100
    assert error_of(conn, flood) == wire.ENHANCE_YOUR_CALM


def test_stream_ids_must_be_odd_and_increasing() -> None:
    encoder = hpack.Encoder()
    conn, _ = opened()
    conn.receive(one_call(encoder, 3))
    assert error_of(conn, one_call(encoder, 1)) == wire.PROTOCOL_ERROR
    conn, _ = opened()
    assert error_of(conn, one_call(hpack.Encoder(), 2)) == wire.PROTOCOL_ERROR


def test_data_on_idle_closed_and_reset_streams() -> None:
    encoder = hpack.Encoder()
    conn, recorder = opened()
    assert error_of(conn, raw_frame(0, 0, 1, MESSAGE)) == wire.PROTOCOL_ERROR  # idle
    conn, recorder = opened()
    conn.receive(one_call(encoder, 1))  # the client has ended stream 1
    conn.receive(raw_frame(0, 0, 1, MESSAGE))
    assert frames_of(conn.data_to_send()) == [(3, 0, 1, (5).to_bytes(4, "big"))]
    assert recorder.events[-1] == ("reset", 1)  # STREAM_CLOSED, the call gone
    # answered before the client finished: RST_STREAM NO_ERROR, what still comes is dropped
    conn.receive(raw_frame(1, 0x4, 3, encoder.encode(REQUEST)))
    conn.end_stream(3, [(b"grpc-status", b"0")])
    sent = frames_of(conn.data_to_send())
    assert [(kind, flags) for kind, flags, _, _ in sent] == [(1, 0x5), (3, 0)]
    assert sent[1][3] == bytes(4)
    conn.receive(raw_frame(0, 0x1, 3, MESSAGE) + raw_frame(1, 0x5, 3, encoder.encode([])))
    assert conn.data_to_send() == b""


def test_headers_out_follow_the_clients_table_size_and_frame_size() -> None:
    conn, _ = opened(header_table_size=0)
    conn.receive(raw_frame(1, 0x5, 1, hpack.Encoder().encode(REQUEST)))
    status = [(b":status", b"200")]
    blocks = []
    for _ in range(2):  # the same list twice: the second comes from the encoder's memory
        conn.send_headers(1, status)
        blocks.append(frames_of(conn.data_to_send())[0][3])
    # a dynamic table size update to 0 first (RFC 7541 6.3), once; :status 200 is static 8
    assert blocks == [b"\x20\x88", b"\x88"]
    trailers = [(b"grpc-status", b"13"), (b"grpc-message", b"m" * 40000)]  # long: not Huffman-coded
    conn.end_stream(1, trailers)
    sent = frames_of(conn.data_to_send())
    assert [(kind, flags) for kind, flags, _, _ in sent] == [(1, 0x1), (9, 0), (9, 0x4)]
    decoder = hpack.Decoder()
    decoder.max_allowed_table_size = 0
    decoder.decode(blocks[0], raw=True)
    assert decoder.decode(b"".join(payload for _, _, _, payload in sent), raw=True) == trailers


def test_a_repeated_block_is_decoded_against_the_table_as_it_is_now() -> None:
    """The last stateless block is remembered; a block that changes the table forgets it."""
    conn, recorder = opened()
    insert_a = b"\x40" + b"\x01a\x011"  # literal with incremental indexing, a: 1
    insert_b = b"\x40" + b"\x01b\x012"
    newest = b"\xbe"  # index 62, the newest entry of the dynamic table
    pseudo = b"\x83\x86\x84"  # static :method POST, :scheme http, :path /
    for stream_id, block in enumerate((insert_a, newest, newest, insert_b, newest), 0):
        conn.receive(raw_frame(1, 0x5, 2 * stream_id + 1, pseudo + block))
    requests = [event[2] for event in recorder.events if event[0] == "request"]
    first = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/")]
    a, b = [*first, (b"a", b"1")], [*first, (b"b", b"2")]
    assert requests == [a, a, a, b, b]


def test_a_broken_hpack_block_is_a_compression_error() -> None:
    conn, _ = opened()
    assert error_of(conn, raw_frame(1, 0x5, 1, b"\xff\xff\xff")) == wire.COMPRESSION_ERROR


def test_rst_stream_from_the_client_ends_the_call_and_goaway_is_seen() -> None:
    conn, recorder = opened()
    conn.receive(raw_frame(1, 0x4, 1, hpack.Encoder().encode(REQUEST)))
    conn.receive(raw_frame(3, 0, 1, (8).to_bytes(4, "big")))
    assert recorder.events[-1] == ("reset", 1) and conn.window(1) == 0
    conn.receive(raw_frame(7, 0, 0, bytes(8)))
    assert recorder.events[-1] == ("goaway",)
    assert error_of(conn, raw_frame(3, 0, 9, bytes(4))) == wire.PROTOCOL_ERROR  # idle


_STREAMS = st.sampled_from([0, 1, 3, 5, 2, 0x7FFFFFFF])
_ANY_FRAME = st.one_of(
    # anything at all: every type RFC 9113 defines and one it does not, any flags and bytes
    st.tuples(st.integers(0, 10), st.integers(0, 255), _STREAMS, st.binary(max_size=40)),
    # well formed, so that streams open and reach their later states
    st.tuples(
        st.just(1), st.sampled_from([4, 5]), st.sampled_from([1, 3, 5]), st.just(b"\x00")
    ),  # HEADERS: a block filled in below
    st.tuples(st.just(0), st.sampled_from([0, 1]), _STREAMS, st.binary(max_size=30)),
    st.tuples(
        st.sampled_from([3, 8]),
        st.just(0),
        _STREAMS,
        st.integers(0, 2**32 - 1).map(lambda n: n.to_bytes(4, "big")),
    ),
    st.tuples(st.just(6), st.sampled_from([0, 1]), st.just(0), st.binary(min_size=8, max_size=8)),
    st.tuples(
        st.just(4),
        st.sampled_from([0, 1]),
        st.just(0),
        st.lists(st.tuples(st.integers(1, 9), st.integers(0, 2**32 - 1)), max_size=3).map(
            lambda kv: b"".join(struct.pack(">HL", k, v) for k, v in kv)
        ),
    ),
)


@hypothesis.settings(max_examples=400, deadline=None)
@given(frames=st.lists(_ANY_FRAME, max_size=12), cut=st.integers(1, 64))
def test_any_frames_end_in_events_or_a_connection_error(
    frames: list[tuple[int, int, int, bytes]], cut: int
) -> None:
    """Whatever frames follow a good opening, in whatever pieces they arrive, the framing
    raises nothing but ConnectionError_ (the connection's GOAWAY), never a bug of its own."""
    events = Recorder()
    conn = Http2(events)
    conn.initiate()
    encoder = hpack.Encoder()
    sent = PREFACE + settings()
    for kind, flags, stream_id, payload in frames:
        if kind == 1 and payload == b"\x00":
            payload = encoder.encode(REQUEST)
        sent += raw_frame(kind, flags, stream_id, payload)
    try:
        for start in range(0, len(sent), cut):
            conn.receive(sent[start : start + cut])
    except ConnectionError_ as exc:
        assert exc.code in {
            wire.PROTOCOL_ERROR,
            wire.FLOW_CONTROL_ERROR,
            wire.FRAME_SIZE_ERROR,
            wire.COMPRESSION_ERROR,
            wire.ENHANCE_YOUR_CALM,
        }
    conn.data_to_send()


@hypothesis.settings(max_examples=60, deadline=None)
@given(frames=st.lists(_ANY_FRAME, min_size=1, max_size=12))
def test_any_frames_cost_time_in_proportion_to_their_bytes(
    frames: list[tuple[int, int, int, bytes]],
) -> None:
    """A fuzz target bounding time per byte (issue 42): a sequence repeated into ~256 KiB is
    handled, turn after turn, in time linear in its size (generously bounded: a loaded 2-core
    machine runs it; a quadratic path or an unbounded walk per frame blows through the bound)."""
    conn = Http2(Recorder())
    conn.initiate()
    encoder = hpack.Encoder()
    block = encoder.encode(REQUEST)
    chunk = b"".join(
        raw_frame(kind, flags, stream_id, block if kind == 1 and payload == b"\x00" else payload)
        for kind, flags, stream_id, payload in frames
    )
    sent = PREFACE + settings() + chunk * max(1, (256 << 10) // max(1, len(chunk)))
    started = time.perf_counter()
    try:
        for start in range(0, len(sent), 65536):
            conn.receive(sent[start : start + 65536])
            while conn.pending:
                conn.receive(b"")
            conn.data_to_send()
    except ConnectionError_:
        pass
    elapsed = time.perf_counter() - started
    assert elapsed < 0.5 + 20e-6 * len(sent), f"{elapsed:.2f} s for {len(sent)} bytes"


# ---- malformed requests (RFC 9113 8.1.1, h2spec 8.1.2.x; issue 42) -------------------------
