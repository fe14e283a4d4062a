"""What one unary gRPC call costs the h2 state machine on the server's side, in process.

A client H2Connection sends `simple`-sized calls (the headers a gRPC C++ client sends, a
205-byte message) to a server H2Connection configured as the gRPC transport configures it
(oceanus/frontends/grpc/h2connection.py); the server reads each call and answers it with
response headers, one message and trailers, as the transport does. Only the server's side is
timed: `receive_data`, the sends and `data_to_send`, no sockets, no event loop. That is the
part of a gRPC request's cost the transport's library owns, beside the servicer's.

    python bench/grpc_transport_cost.py [--calls 20000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import h2.config
import h2.connection
import h2.events

sys.path.insert(0, str(Path(__file__).parent))
import benchlib

from oceanus.frontends.grpc.h2call import OK_TRAILERS, RESPONSE_HEADERS
from oceanus.frontends.grpc.h2connection import _CONFIG

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


def server_us_per_call(calls: int) -> float:
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    server = h2.connection.H2Connection(_CONFIG)
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
        wire = client.data_to_send()
        start = time.perf_counter()
        for event in server.receive_data(wire):
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
    rounds = [server_us_per_call(args.calls) for _ in range(args.repeat)]
    median = benchlib.median(rounds)
    print(
        benchlib.table(
            ["part", "µs per unary call (median)", "rounds"],
            [["h2, server side", f"{median:.1f}", " ".join(f"{r:.1f}" for r in rounds)]],
        )
    )
    out = benchlib.RESULTS_DIR / f"grpc-transport-cost-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    document = {"calls": args.calls, "loadavg_before": load_before, "rounds_us": rounds}
    out.write_text(json.dumps(document, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
