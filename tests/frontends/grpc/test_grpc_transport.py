"""The gRPC frontend's HTTP/2 transport (frontends/grpc_transport/): deadlines, compression,
keepalive and ping policy, connection age, broken peers; its wire helpers in process."""

from __future__ import annotations

import contextlib
import queue
import socket
import time
from collections.abc import Iterator
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb

from oceanus.examples import example_repository
from oceanus.frontends.grpc_transport.call import (
    MessageError,
    MessageReader,
    metadata_of,
    parse_timeout,
    percent_encode,
)


def _simple_inputs(value: int = 3) -> list[grpcclient.InferInput]:
    tensors = []
    for name in ("INPUT0", "INPUT1"):
        tensor = grpcclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(np.full((1, 16), value, np.int32))
        tensors.append(tensor)
    return tensors


# ---- through tritonclient, on the session server -------------------------------------------


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_are_served(
    grpc_client: grpcclient.InferenceServerClient, algorithm: str
) -> None:
    result = grpc_client.infer("simple", _simple_inputs(4), compression_algorithm=algorithm)
    assert result.as_numpy("OUTPUT0").tolist() == [[8] * 16]


def test_messages_past_the_flow_control_windows_cross_whole(server: Any) -> None:
    """24 MiB each way, unary and three on one stream: past the 16 MiB windows the server
    grants and far past the 64 KiB a client starts with, so both directions wait for
    WINDOW_UPDATEs (and the stream's writer for the client to read)."""
    rng = np.random.default_rng(5)
    tensors = [rng.standard_normal((1, 6 << 20)).astype(np.float32) for _ in range(3)]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    received: queue.Queue[Any] = queue.Queue()
    try:
        tensor = grpcclient.InferInput("INPUT0", [1, 6 << 20], "FP32")
        tensor.set_data_from_numpy(tensors[0])
        assert np.array_equal(
            client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0"), tensors[0]
        )
        client.start_stream(callback=lambda result, error: received.put(error or result))
        for index, data in enumerate(tensors):
            tensor = grpcclient.InferInput("INPUT0", [1, 6 << 20], "FP32")
            tensor.set_data_from_numpy(data)
            client.async_stream_infer("identity_fp32", [tensor], request_id=str(index))
        client.stop_stream()
    finally:
        client.close()
    results = [received.get(timeout=30) for _ in tensors]
    by_id = {r.get_response().id: r.as_numpy("OUTPUT0") for r in results}
    for index, data in enumerate(tensors):
        assert np.array_equal(by_id[str(index)], data)


def test_the_grpcio_escape_hatch_still_serves(launch: Any) -> None:
    """OCEANUS_GRPC_TRANSPORT=grpcio serves the same servicers on grpc.aio: unary and a
    stream answer as on the h2 transport."""
    server = launch(
        [example_repository(["simple"])],
        ["--allow-metrics=false"],
        env={"OCEANUS_GRPC_TRANSPORT": "grpcio"},
    )
    client = grpcclient.InferenceServerClient(server.grpc_url)
    received: queue.Queue[Any] = queue.Queue()
    try:
        assert client.infer("simple", _simple_inputs(2)).as_numpy("OUTPUT0")[0][0] == 4
        client.start_stream(callback=lambda result, error: received.put(error or result))
        client.async_stream_infer("simple", _simple_inputs(5), request_id="s")
        client.stop_stream()
    finally:
        client.close()
    result = received.get(timeout=10)
    assert result.get_response().id == "s"
    assert result.as_numpy("OUTPUT1")[0][0] == 0
    assert "gRPC on grpc.aio (OCEANUS_GRPC_TRANSPORT=grpcio)" in server.log()


# ---- raw HTTP/2 peers ---------------------------------------------------------------------


class RawPeer:
    """A client that speaks HTTP/2 with h2 but acts only when told: to ping too often, to
    ignore pings, to see a GOAWAY."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.h2.initiate_connection()
        self.flush()

    def flush(self) -> None:
        self.sock.sendall(self.h2.data_to_send())

    def events_until(self, wanted: type, seconds: float) -> list[Any]:
        """Events until one of type `wanted` or the connection closes; [] plus None at close."""
        seen: list[Any] = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                data = b""
            if not data:
                seen.append(None)
                return seen
            events = self.h2.receive_data(data)
            # h2 has answered the server's pings and settings; a server that closed after
            # what it sent is still read
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.flush()
            for event in events:
                seen.append(event)
                if isinstance(event, wanted):
                    return seen
        return seen

    def close(self) -> None:
        self.sock.close()


def _call(peer: RawPeer, method: str, message: bytes, headers: list[tuple[str, str]]) -> Any:
    """One call on a new stream; the events until it ends (its trailers among them)."""
    stream = peer.h2.get_next_available_stream_id()
    peer.h2.send_headers(
        stream,
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", f"/inference.GRPCInferenceService/{method}"),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            *headers,
        ],
    )
    peer.h2.send_data(stream, _framed(message), end_stream=True)
    peer.flush()
    return peer.events_until(h2.events.StreamEnded, 10)


def _trailers(events: list[Any]) -> dict[bytes, bytes]:
    found = {}
    for event in events:
        if isinstance(event, (h2.events.TrailersReceived, h2.events.ResponseReceived)):
            found.update(dict(event.headers))
    return found


def test_the_server_ends_a_call_at_its_grpc_timeout(server: Any) -> None:
    """grpc-timeout is the server's deadline too: a call still queued or running when it
    passes answers DEADLINE_EXCEEDED (whatever the client does), and the server keeps serving."""
    request = pb.ModelInferRequest(model_name="slow_fp32")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
    request.raw_input_contents.append(np.ones(16, np.float32).tobytes())
    peer = RawPeer(server.grpc_port)
    try:
        started = time.monotonic()
        events = _call(peer, "ModelInfer", request.SerializeToString(), [("grpc-timeout", "2m")])
        assert time.monotonic() - started < 5
        trailers = _trailers(events)
        assert trailers[b"grpc-status"] == b"4", events
        assert trailers[b"grpc-message"] == b"Deadline Exceeded"
        events = _call(peer, "ServerLive", b"", [("grpc-timeout", "5S")])
        assert _trailers(events)[b"grpc-status"] == b"0"
    finally:
        peer.close()


def test_spent_and_malformed_deadlines_are_answered(server: Any) -> None:
    """A grpc-timeout spent on arrival is DEADLINE_EXCEEDED at once; one of a few ns may
    serve or expire, but is answered (its task was cancelled before it ran: no answer before
    issue 42); a malformed one is grpc core's INTERNAL, in its words."""
    peer = RawPeer(server.grpc_port)
    try:
        for value in ("0n", "0S", "0H"):
            trailers = _trailers(_call(peer, "ServerLive", b"", [("grpc-timeout", value)]))
            assert trailers[b"grpc-status"] == b"4", value
            assert trailers[b"grpc-message"] == b"Deadline Exceeded"
        for _ in range(50):
            for value in ("1n", "1u", "10u"):
                trailers = _trailers(_call(peer, "ServerLive", b"", [("grpc-timeout", value)]))
                assert trailers[b"grpc-status"] in (b"0", b"4"), value
        for value in ("12x", "m", "-1S", "1.5S", "1234567890S"):
            trailers = _trailers(_call(peer, "ServerLive", b"", [("grpc-timeout", value)]))
            assert trailers[b"grpc-status"] == b"13", value
            assert trailers[b"grpc-message"] == b"Error parsing 'grpc-timeout' metadata"
        trailers = _trailers(_call(peer, "ServerLive", b"", [("grpc-timeout", " 5S ")]))
        assert trailers[b"grpc-status"] == b"0"
    finally:
        peer.close()


@pytest.fixture(scope="module")
def strict_server(launch_module: Any) -> Any:
    return launch_module(
        [example_repository(["simple"])],
        [
            "--allow-metrics=false",
            "--grpc-http2-max-ping-strikes=1",
            "--grpc-keepalive-time=300",
            "--grpc-keepalive-timeout=300",
            "--grpc-keepalive-permit-without-calls=true",
            "--grpc-max-connection-age=1500",
            "--grpc-max-connection-age-grace=500",
            "--grpc-max-concurrent-streams=2",
        ],
    )


@pytest.fixture
def peer(strict_server: Any) -> Iterator[RawPeer]:
    client = RawPeer(strict_server.grpc_port)
    yield client
    client.close()


def test_max_concurrent_streams_is_announced_and_past_it_streams_are_refused(
    peer: RawPeer,
) -> None:
    """--grpc-max-concurrent-streams: announced in our SETTINGS; a client that opens more
    anyway gets REFUSED_STREAM for the extra one (h2spec 5.1.2), the others are served."""
    events = peer.events_until(h2.events.RemoteSettingsChanged, 5)
    changed = next(e for e in events if isinstance(e, h2.events.RemoteSettingsChanged))
    assert changed.changed_settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS].new_value == 2
    peer.h2.remote_settings.max_concurrent_streams = 2**31 - 1  # h2 would hold the third back
    peer.h2.remote_settings.acknowledge()
    streams = []
    for _ in range(3):
        stream = peer.h2.get_next_available_stream_id()
        peer.h2.send_headers(
            stream,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", "/inference.GRPCInferenceService/ModelStreamInfer"),
                (":authority", "localhost"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ],
        )
        streams.append(stream)
    peer.flush()
    events = peer.events_until(h2.events.StreamReset, 5)
    reset = events[-1]
    assert isinstance(reset, h2.events.StreamReset), events
    assert (reset.stream_id, reset.error_code) == (streams[2], h2.errors.ErrorCodes.REFUSED_STREAM)


def test_pings_too_often_get_goaway_enhance_your_calm(peer: RawPeer) -> None:
    for n in range(4):
        peer.h2.ping(n.to_bytes(8, "big"))
        peer.flush()
    events = peer.events_until(h2.events.ConnectionTerminated, 5)
    goaway = events[-1]
    assert isinstance(goaway, h2.events.ConnectionTerminated), events
    assert goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    assert goaway.additional_data == b"too_many_pings"


def test_pings_between_a_streams_responses_are_not_strikes(strict_server: Any) -> None:
    """Clients ping after data arrives (gRPC's BDP probes): data the server sends in between
    resets the ping policy, so a long stream is never told to calm down."""
    peer = RawPeer(strict_server.grpc_port)
    try:
        stream = peer.h2.get_next_available_stream_id()
        peer.h2.send_headers(
            stream,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", "/inference.GRPCInferenceService/ModelStreamInfer"),
                (":authority", "localhost"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ],
        )
        request = pb.ModelInferRequest(model_name="simple")
        for name in ("INPUT0", "INPUT1"):
            request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
            request.raw_input_contents.append(np.ones(16, np.int32).tobytes())
        for n in range(4):
            peer.h2.send_data(stream, _framed(request.SerializeToString()))
            peer.flush()
            events = peer.events_until(h2.events.DataReceived, 5)
            assert isinstance(events[-1], h2.events.DataReceived), events
            peer.h2.ping(n.to_bytes(8, "big"))
            peer.flush()
        peer.h2.end_stream(stream)
        peer.flush()
        events = peer.events_until(h2.events.StreamEnded, 5)
        calm = h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
        assert not any(getattr(e, "error_code", None) == calm for e in events), events
        assert _trailers(events)[b"grpc-status"] == b"0"
    finally:
        peer.close()


def test_a_peer_that_never_answers_pings_is_dropped(peer: RawPeer) -> None:
    """keepalive: a PING unanswered for --grpc-keepalive-timeout closes the connection."""
    peer.sock.settimeout(5)
    started = time.monotonic()
    # read without handing anything to h2, so no PING is ever acknowledged
    while peer.sock.recv(65536):
        assert time.monotonic() - started < 5, "still open"
    assert time.monotonic() - started < 5


def test_max_connection_age_sends_goaway_then_closes(strict_server: Any) -> None:
    peer = RawPeer(strict_server.grpc_port)
    try:
        started = time.monotonic()
        events = peer.events_until(h2.events.ConnectionTerminated, 5)
        assert isinstance(events[-1], h2.events.ConnectionTerminated), events
        assert events[-1].error_code == h2.errors.ErrorCodes.NO_ERROR
        assert 1.0 < time.monotonic() - started < 4.0
        assert peer.events_until(type(None), 5)[-1:] == [None]  # closed after the grace
    finally:
        peer.close()


def test_garbage_instead_of_http2_is_closed_and_the_server_keeps_serving(
    strict_server: Any,
) -> None:
    with socket.create_connection(("127.0.0.1", strict_server.grpc_port), timeout=5) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(range(256)) * 4)
        while sock.recv(65536):
            pass
    client = grpcclient.InferenceServerClient(strict_server.grpc_url)
    try:
        assert client.infer("simple", _simple_inputs(1)).as_numpy("OUTPUT0")[0][0] == 2
    finally:
        client.close()


def test_headers_over_64_kib_close_the_connection(strict_server: Any) -> None:
    peer = RawPeer(strict_server.grpc_port)
    try:
        peer.events_until(h2.events.SettingsAcknowledged, 5)  # the server's limit is in force
        stream = peer.h2.get_next_available_stream_id()
        peer.h2.send_headers(
            stream,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", "/inference.GRPCInferenceService/ServerLive"),
                (":authority", "localhost"),
                ("x-huge", "v" * (70 << 10)),
            ],
        )
        # GOAWAY PROTOCOL_ERROR, or the reset of a socket closed with our headers unread
        try:
            peer.flush()
            last = peer.events_until(h2.events.ConnectionTerminated, 5)[-1]
        except (ConnectionResetError, BrokenPipeError):
            last = None
        if last is not None:
            assert isinstance(last, h2.events.ConnectionTerminated), last
            assert last.error_code != h2.errors.ErrorCodes.NO_ERROR
    finally:
        peer.close()


# ---- the wire helpers, in process --------------------------------------------------------


def _framed(message: bytes, flag: int = 0) -> bytes:
    return bytes((flag,)) + len(message).to_bytes(4, "big") + message


def test_messages_cut_across_frames_and_together() -> None:
    reader = MessageReader(b"identity", 1 << 20)
    wire = _framed(b"first") + _framed(b"") + _framed(b"x" * 1000)
    got: list[bytes] = []
    for start in range(0, len(wire), 7):
        got += reader.feed(wire[start : start + 7])
    assert got == [b"first", b"", b"x" * 1000]
    assert not reader.partial
    assert MessageReader(b"identity", 100).feed(_framed(b"whole")) == [b"whole"]


def test_a_message_over_the_limit_is_refused_before_it_is_buffered() -> None:
    reader = MessageReader(b"identity", 100)
    with pytest.raises(MessageError) as info:
        reader.feed(_framed(b"y" * 101)[:10])
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert info.value.details == "Received message larger than max (101 vs. 100)"


def test_compressed_messages_and_bombs() -> None:
    import gzip

    assert MessageReader(b"gzip", 1000).feed(_framed(gzip.compress(b"z" * 999), 1)) == [b"z" * 999]
    with pytest.raises(MessageError) as info:
        MessageReader(b"gzip", 1000).feed(_framed(gzip.compress(b"z" * 100_000), 1))
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    with pytest.raises(MessageError) as info:
        MessageReader(b"snappy", 1000).feed(_framed(b"abc", 1))
    assert info.value.code == grpc.StatusCode.UNIMPLEMENTED


def test_timeouts_status_text_and_metadata() -> None:
    assert parse_timeout(b"250m") == pytest.approx(0.25)
    assert parse_timeout(b"3S") == 3.0
    assert parse_timeout(b"2H") == 7200.0
    assert parse_timeout(b"12x") is None
    assert parse_timeout(b"m") is None
    assert parse_timeout(b"123456789S") == 123456789.0  # grpc core takes 9 digits
    assert parse_timeout(b"1234567890S") is None
    assert parse_timeout(b"-1S") is None
    assert percent_encode("plain text") == b"plain text"
    assert percent_encode("50% \u00b2\n") == b"50%25 %C2%B2%0A"
    headers = [
        (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        (b"grpc-timeout", b"1S"),
        (b"user-agent", b"grpc-c"),
        (b"x-key-bin", b"AP8"),
        (b"x-key", b"value"),
    ]
    assert metadata_of(headers) == (
        ("user-agent", "grpc-c"),
        ("x-key-bin", b"\x00\xff"),
        ("x-key", "value"),
    )
