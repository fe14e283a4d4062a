"""What one unary gRPC call costs the HTTP/2 layer on the server's side, in process.

A client sends `simple`-sized calls (the headers a gRPC C++ client sends, a 205-byte message)
to the transport's HTTP/2 layer (oceanus/frontends/grpc_transport/framing.py); the server reads
each call and answers it with response headers, one message and trailers, as the transport
does. Only the server's side is timed: `receive`, the sends and `data_to_send`, no sockets, no
event loop.
That is the part of a gRPC request's cost the transport's framing owns, beside the servicer's.

With the `h2` library installed (the [test] extra) the same workload also runs on an h2 server
configured as the transport configured it before it had its own framing: the "before" row.

    python bench/grpc_transport_cost.py [--calls 20000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path

import hpack

sys.path.insert(0, str(Path(__file__).parent))
import benchlib

from oceanus.frontends.grpc_transport import framing, wire
from oceanus.frontends.grpc_transport.call import OK_TRAILERS, RESPONSE_HEADERS
from oceanus.frontends.grpc_transport.events import Events
from oceanus.frontends.grpc_transport.headers import HeaderCodec

REQUEST_HEADERS = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/inference.GRPCInferenceService/ModelInfer"),
    (":authority", "127.0.0.1:8001"),
    ("te", "trailers"),
    ("content-type", "application/grpc"),
    ("user-agent", "grpc-c++/1.62.1 grpc-c/39.0.0 (linux; chttp2)"),
    ("grpc-accept-encoding", "identity,deflate,gzip"),
]
MESSAGE = b"\0" + (200).to_bytes(4, "big") + bytes(200)


def _frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + struct.pack(">BBL", kind, flags, stream_id) + payload


class _ForgetfulCodec(HeaderCodec):
    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        self._decoded = None
        return super().decode(block)


class _EveryBlockDecoded(framing.Http2):
    """Without the memory of the last stateless header block: what a client whose headers
    change every call (a grpc-timeout counting down, a request id) costs."""

    def __init__(self, events: Events) -> None:
        super().__init__(events)
        self._codec = _ForgetfulCodec()


class _Answering:
    """The server's connection: answers each call once its request has ended."""

    def __init__(self, kind: type[framing.Http2]) -> None:
        self.conn = kind(self)

    def on_end(self, stream_id: int) -> None:
        conn = self.conn
        conn.send_headers(stream_id, RESPONSE_HEADERS)
        conn.send_data(stream_id, MESSAGE)
        conn.end_stream(stream_id, OK_TRAILERS)

    def on_request(self, stream_id: int, headers: list[tuple[bytes, bytes]]) -> None:
        pass

    def on_data(self, stream_id: int, data: bytes) -> None:
        pass

    def on_reset(self, stream_id: int) -> None:
        pass

    def on_window(self, stream_id: int) -> None:
        pass

    def on_ping(self) -> None:
        pass

    def on_ping_ack(self) -> None:
        pass

    def on_goaway(self) -> None:
        pass


def ours_us_per_call(calls: int, kind: type[framing.Http2] = framing.Http2) -> float:
    server = _Answering(kind)
    server.conn.initiate()
    server.conn.data_to_send()
    # The client opens its windows wide once, so it never has to answer the server's DATA.
    settings = struct.pack(">HL", wire.INITIAL_WINDOW_SIZE, wire.MAX_WINDOW)
    opening = _frame(wire.SETTINGS, 0, 0, settings) + _frame(
        wire.WINDOW_UPDATE, 0, 0, (wire.MAX_WINDOW - 65535).to_bytes(4, "big")
    )
    server.conn.receive(wire.PREFACE + opening)
    server.conn.data_to_send()
    encoder = hpack.Encoder()
    spent = 0.0
    for call in range(calls):
        stream = 2 * call + 1
        sent = _frame(wire.HEADERS, wire.END_HEADERS, stream, encoder.encode(REQUEST_HEADERS))
        sent += _frame(wire.DATA, wire.END_STREAM, stream, MESSAGE)
        start = time.perf_counter()
        server.conn.receive(sent)
        answer = server.conn.data_to_send()
        spent += time.perf_counter() - start
        assert answer
    return spent / calls * 1e6


def h2_us_per_call(calls: int) -> float:
    """The same on the h2 library, configured as the transport configured it before."""
    import h2.config
    import h2.connection
    import h2.events

    config = h2.config.H2Configuration(
        client_side=False,
        header_encoding=None,
        validate_inbound_headers=False,
        normalize_inbound_headers=False,
        validate_outbound_headers=False,
        normalize_outbound_headers=False,
    )
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    server = h2.connection.H2Connection(config)
    client.initiate_connection()
    server.initiate_connection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())
    spent = 0.0
    for _ in range(calls):
        stream = client.get_next_available_stream_id()
        client.send_headers(stream, REQUEST_HEADERS)
        client.send_data(stream, MESSAGE, end_stream=True)
        sent = client.data_to_send()
        start = time.perf_counter()
        for event in server.receive_data(sent):
            if type(event) is h2.events.DataReceived:
                server.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif type(event) is h2.events.StreamEnded:
                server.send_headers(event.stream_id, RESPONSE_HEADERS)
                server.send_data(event.stream_id, MESSAGE)
                server.send_headers(event.stream_id, OK_TRAILERS, end_stream=True)
        answer = server.data_to_send()
        spent += time.perf_counter() - start
        for event in client.receive_data(answer):
            if type(event) is h2.events.DataReceived:
                client.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
    return spent / calls * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    load_before = benchlib.loadavg()
    parts: dict[str, Callable[[int], float]] = {
        "ours (framing.py), server side": ours_us_per_call,
        "ours, every header block decoded": lambda n: ours_us_per_call(n, _EveryBlockDecoded),
    }
    if importlib.util.find_spec("h2") is not None:
        parts["h2 (before), server side"] = h2_us_per_call
    rounds: dict[str, list[float]] = {name: [] for name in parts}
    for _ in range(args.repeat):  # alternating, so both see the same machine
        for name, run in parts.items():
            rounds[name].append(run(args.calls))
    rows = [
        [name, f"{benchlib.median(r):.1f}", " ".join(f"{x:.1f}" for x in r)]
        for name, r in rounds.items()
    ]
    print(benchlib.table(["part", "µs per unary call (median)", "rounds"], rows))
    out = benchlib.RESULTS_DIR / f"grpc-transport-cost-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    document = {"calls": args.calls, "loadavg_before": load_before, "rounds_us": rounds}
    out.write_text(json.dumps(document, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
