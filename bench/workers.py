"""Frontend worker processes (issue 16): throughput, and CPU time per request per process role.

On a 2-core machine that also runs the load generator, throughput alone cannot show how far the
work spreads, so each run also measures cost: the CPU time (user + system, /proc/<pid>/stat) of
every server process over a fixed perf_analyzer run, divided by the requests the server counted
(/v2/models/<m>/stats). Roles: the core process (the one started), the frontend workers (its
`oceanus.frontend_worker` children). From the costs, a projection for a 16-core machine: the core
bounds throughput at 1e6 / core-µs, 15 cores of frontends at 15e6 / frontend-µs.

Servers with each `--frontend-workers` value are all up at once and measured in turn, each
round, so the machine's noise hits them alike; medians over the rounds are printed and written to
bench/results/workers-<timestamp>.json, with the batch-size histogram of `simple_dyna` per
server (batching must not get worse with workers). Beside them, gRPC's floor: bench/grpc_echo.py
(a server answering a precomputed response) on the h2 transport and on grpc.aio, in 1 and 2
processes.

    python bench/workers.py [--workers 0,2] [--repeat 3] [--window-ms 3000] [--concurrency 16]
                            [--points simple/http,simple/grpc] [--no-echo] [--baseline DIR]
                            [--rings] [--grpcio]

`--baseline DIR` serves the same points with the Oceanus of another checkout beside these
(rows `base:N`): a before/after of a change in one run. `--rings` serves each worker count twice,
the link's messages over the socket (rows `N`) and in shared-memory rings (rows `rings:N`,
OCEANUS_LINK_MSG_RINGS=1). `--grpcio` serves each worker count a second time with the gRPC
frontend on grpc.aio (rows `grpcio:N`, OCEANUS_GRPC_TRANSPORT=grpcio) beside the h2 transport.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import benchlib
import perf

POINTS = (("simple", "http"), ("simple", "grpc"), ("simple_dyna", "http"))


def sleeps(pid: int) -> int:
    """Voluntary context switches of all a process's threads so far: each is one sleep, so one
    wake-up paid later (0 once it is gone)."""
    return benchlib.thread_status_sum(pid, "voluntary_ctxt_switches")


def switches_and_syscalls(pid: int) -> tuple[int, int, int]:
    """(times preempted: involuntary context switches of all its threads, read system calls,
    write system calls) of a process so far (zeros once it is gone): with the sleeps, the core's
    per-request budget beyond its Python (docs/architecture.md, "The core's budget")."""
    reads = writes = 0
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("syscr:"):
                reads = int(line.split()[1])
            elif line.startswith("syscw:"):
                writes = int(line.split()[1])
    except OSError:
        return 0, 0, 0
    return benchlib.thread_status_sum(pid, "nonvoluntary_ctxt_switches"), reads, writes


def worker_pids(core_pid: int) -> list[int]:
    """The core's frontend worker children (python -m oceanus.frontend_worker)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == core_pid and b"oceanus.frontend_worker" in command:
            found.append(int(entry.name))
    return sorted(found)


def served(url: str, model: str) -> int:
    return benchlib.model_stats(url, model)["inference_count"]


def batch_histogram(url: str, model: str) -> dict[int, int]:
    status, body = benchlib.http_get(f"http://{url}/v2/models/{model}/stats", timeout=10.0)
    if status != 200:
        return {}
    histogram: dict[int, int] = {}
    for stats in json.loads(body)["model_stats"]:
        for entry in stats.get("batch_stats", []):
            size = int(entry["batch_size"])
            histogram[size] = histogram.get(size, 0) + int(entry["compute_infer"]["count"])
    return dict(sorted(histogram.items()))


def measure(
    server: benchlib.Server,
    pa: tuple[Path, dict[str, str]],
    model: str,
    protocol: str,
    args: argparse.Namespace,
) -> dict[str, Any]:
    core = server.proc.pid
    workers = worker_pids(core)
    url = server.http_url if protocol == "http" else server.grpc_url
    assert url is not None
    before_core = benchlib.cpu_seconds(core)
    before_workers = sum(benchlib.cpu_seconds(pid) for pid in workers)
    before_sleeps = sleeps(core), sum(sleeps(pid) for pid in workers)
    before_counters = switches_and_syscalls(core)
    before_count = served(server.http_url, model)
    row = perf.run_level(
        pa[0], pa[1], model, url, args.concurrency, protocol=protocol, window_ms=args.window_ms
    )
    requests = served(server.http_url, model) - before_count
    core_s = benchlib.cpu_seconds(core) - before_core
    workers_s = sum(benchlib.cpu_seconds(pid) for pid in workers) - before_workers
    core_sleeps = sleeps(core) - before_sleeps[0]
    worker_sleeps = sum(sleeps(pid) for pid in workers) - before_sleeps[1]
    counters = [b - a for a, b in zip(before_counters, switches_and_syscalls(core), strict=True)]
    result: dict[str, Any] = {
        "infer_per_s": row.get("throughput"),
        "p99_ms": row.get("p99_ms"),
        "requests": requests,
        "command": row.get("command"),
        "error": row.get("error"),
    }
    if requests > 0:
        result["core_us"] = round(core_s / requests * 1e6, 1)
        result["frontend_us"] = round(workers_s / requests * 1e6, 1)
        result["total_us"] = round((core_s + workers_s) / requests * 1e6, 1)
        result["core_wakeups"] = round(core_sleeps / requests, 2)
        result["frontend_wakeups"] = round(worker_sleeps / requests, 2)
        names = ("core_preempted", "core_reads", "core_writes")
        for key, count in zip(names, counters, strict=True):
            result[key] = round(count / requests, 2)
        core_bound = 1e6 / result["core_us"] if result["core_us"] else float("inf")
        if workers:
            frontend_bound = 15e6 / result["frontend_us"] if result["frontend_us"] else 0.0
            result["projected_16_cores"] = round(min(core_bound, frontend_bound))
        else:  # one process does everything: it is the bound
            result["projected_16_cores"] = round(core_bound)
    return result


@contextlib.contextmanager
def echo_server(processes: int, transport: str, log_dir: Path) -> Any:
    """bench/grpc_echo.py on a free port; yields its gRPC url."""
    port = benchlib.free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    with (log_dir / f"echo-{transport}-{processes}.log").open("wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(benchlib.BENCH_DIR / "grpc_echo.py"),
                "--port",
                str(port),
                "--processes",
                str(processes),
                "--transport",
                transport,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        benchlib.stop_process(proc)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="0,2", help="--frontend-workers values")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--window-ms", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--points",
        default=",".join(f"{m}/{p}" for m, p in POINTS),
        help="model/protocol pairs to measure",
    )
    parser.add_argument("--no-echo", action="store_true", help="skip gRPC's floor (grpc_echo)")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout (an earlier commit): its servers run beside these, as 'base:N'",
    )
    parser.add_argument(
        "--rings",
        action="store_true",
        help="each worker count also with the message rings on (rows 'rings:N'), off in the rest",
    )
    parser.add_argument(
        "--grpcio",
        action="store_true",
        help="each worker count also with the gRPC frontend on grpc.aio (rows 'grpcio:N')",
    )
    args = parser.parse_args()
    points = [tuple(point.split("/", 1)) for point in args.points.split(",")]
    pa = perf.find_perf_analyzer()
    if pa is None:
        print("perf_analyzer not found: run scripts/install_perf_analyzer.sh", file=sys.stderr)
        return 1
    counts = [int(c) for c in args.workers.split(",")]
    repository = benchlib.example_repository(sorted({model for model, _ in points}))
    log_dir = benchlib.RESULTS_DIR / f"workers-{time.strftime('%Y%m%d-%H%M%S')}-logs"
    load_before = benchlib.loadavg()
    rows: dict[str, list[dict[str, Any]]] = {}
    histograms: dict[str, dict[int, int]] = {}
    with contextlib.ExitStack() as stack:
        servers: dict[str, benchlib.Server] = {}
        variants: list[tuple[Path | None, str, dict[str, str] | None]] = [(None, "", None)]
        if args.rings:
            variants = [
                (None, "", {"OCEANUS_LINK_MSG_RINGS": "0"}),
                (None, "rings:", {"OCEANUS_LINK_MSG_RINGS": "1"}),
            ]
        if args.grpcio:
            variants.append((None, "grpcio:", {"OCEANUS_GRPC_TRANSPORT": "grpcio"}))
        if args.baseline is not None:
            variants.append((args.baseline, "base:", None))
        for checkout, prefix, env in variants:
            for count in counts:
                if prefix == "rings:" and count == 0:
                    continue  # no link without workers
                servers[f"{prefix}{count}"] = stack.enter_context(
                    benchlib.oceanus_server(
                        repository,
                        log_dir,
                        tag=f"{prefix.rstrip(':')}workers{count}",
                        extra=[f"--frontend-workers={count}"],
                        checkout=checkout,
                        env=env,
                    )
                )
        echo_kinds = () if args.no_echo else ((1, "h2"), (2, "h2"), (1, "grpcio"), (2, "grpcio"))
        echoes = {kind: stack.enter_context(echo_server(*kind, log_dir)) for kind in echo_kinds}
        for round_index in range(args.repeat):
            for (processes, transport), url in echoes.items():
                row = perf.run_level(
                    pa[0],
                    pa[1],
                    "simple",
                    url,
                    args.concurrency,
                    protocol="grpc",
                    window_ms=args.window_ms,
                )
                key = f"grpc-echo/{transport}/processes={processes}"
                rows.setdefault(key, []).append({"infer_per_s": row.get("throughput")})
                print(f"round {round_index + 1} {key}: {row.get('throughput')} infer/s")
            for model, protocol in points:
                for label, server in servers.items():
                    key = f"{model}/{protocol}/workers={label}"
                    result = measure(server, pa, model, protocol, args)
                    rows.setdefault(key, []).append(result)
                    print(
                        f"round {round_index + 1} {key}: {result.get('infer_per_s')} infer/s, "
                        f"core {result.get('core_us')} us, "
                        f"frontends {result.get('frontend_us')} us, "
                        f"core wake-ups {result.get('core_wakeups')}/req, "
                        f"preempted {result.get('core_preempted')}/req, "
                        f"read/write calls {result.get('core_reads')}/"
                        f"{result.get('core_writes')} per req"
                    )
        for label, server in servers.items():
            if ("simple_dyna", "http") not in points:
                break
            histograms[f"workers={label}"] = batch_histogram(server.http_url, "simple_dyna")
    medians: dict[str, dict[str, Any]] = {}
    for key, results in rows.items():
        medians[key] = {
            field: benchlib.median([r[field] for r in results if r.get(field) is not None])
            if any(r.get(field) is not None for r in results)
            else None
            for field in (
                "infer_per_s",
                "p99_ms",
                "core_us",
                "frontend_us",
                "total_us",
                "core_wakeups",
                "frontend_wakeups",
                "core_preempted",
                "core_reads",
                "core_writes",
                "projected_16_cores",
            )
        }
    table_rows = []
    for key, median in medians.items():
        if key.startswith("grpc-echo"):
            continue
        model, protocol, workers = key.split("/")
        base = medians.get(f"{model}/{protocol}/workers=0", {}).get("infer_per_s")
        ratio = (median["infer_per_s"] / base) if base and median["infer_per_s"] else None
        table_rows.append(
            [
                model,
                protocol,
                workers.split("=")[1],
                benchlib.fmt_num(median["infer_per_s"]),
                benchlib.fmt_num(ratio, 2),
                benchlib.fmt_num(median["p99_ms"], 2),
                benchlib.fmt_num(median["core_us"]),
                benchlib.fmt_num(median["frontend_us"]),
                benchlib.fmt_num(median["total_us"]),
                benchlib.fmt_num(median["core_wakeups"], 2),
                benchlib.fmt_num(median["frontend_wakeups"], 2),
                benchlib.fmt_num(median["projected_16_cores"], 0),
            ]
        )
    print(
        benchlib.table(
            [
                "model",
                "protocol",
                "workers",
                "infer/s",
                "x workers=0",
                "p99 ms",
                "core us/req",
                "frontends us/req",
                "all us/req",
                "core wake-ups/req",
                "frontends wake-ups/req",
                "16-core projection",
            ],
            table_rows,
        )
    )
    for key, median in medians.items():
        if key.startswith("grpc-echo"):
            print(f"{key}: {benchlib.fmt_num(median['infer_per_s'])} infer/s (gRPC's floor)")
    for name, histogram in histograms.items():
        total = sum(histogram.values())
        mean = sum(size * n for size, n in histogram.items()) / total if total else 0.0
        print(f"simple_dyna batches, {name}: mean {mean:.2f}, {histogram}")
    benchlib.write_side_by_side(
        "workers", args, load_before, medians=medians, rounds=rows, batch_histograms=histograms
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
