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
from pathlib import Path
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.events

sys.path.insert(0, str(Path(__file__).parent))
import benchlib
from grpc_attacks import ATTACKS, INFER, Raw, simple_request

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
    return benchlib.tree_kib(pid, "VmRSS") / 1024


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
