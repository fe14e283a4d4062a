"""Busy polling at concurrency 1: `simple` served with several `--http-busy-poll-us` budgets.

One server per budget (0 = off), all up at once and measured in turn each round, so the
machine's noise hits them alike. Per server and round: perf_analyzer at concurrency 1 (p50,
infer/s), the server's CPU use meanwhile (% of one core, from /proc/<pid>/stat), and the p50 of
sequential tritonclient.http requests (a client whose own work puts more time between a
response and the next request). Medians are printed and written to
bench/results/busy-poll-<timestamp>.json with the perf_analyzer commands.

    python bench/busy_poll.py [--budgets 0,200,1000] [--repeat 5] [--window-ms 1500]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import benchlib
import latency
import perf

MODEL = "simple"


def measure(
    server: benchlib.Server, pa: tuple[Path, dict[str, str]], window_ms: int, call: Any
) -> dict[str, Any]:
    cpu_before, began = benchlib.cpu_seconds(server.proc.pid), time.perf_counter()
    row = perf.run_level(pa[0], pa[1], MODEL, server.http_url, 1, window_ms=window_ms)
    cpu = (benchlib.cpu_seconds(server.proc.pid) - cpu_before) / (time.perf_counter() - began)
    latency.timed(call, 200)  # warm-up
    client_s = latency.timed(call, 2000)
    return {
        "pa_p50_ms": row.get("p50_ms"),
        "pa_infer_per_s": row.get("throughput"),
        "server_cpu_pct": round(100 * cpu, 1),
        "tritonclient_p50_ms": round(benchlib.median(client_s) * 1000, 4),
        "command": row.get("command"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", default="0,200,1000", help="--http-busy-poll-us values")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--window-ms", type=int, default=1500)
    args = parser.parse_args()
    args.concurrency = 1
    pa = perf.find_perf_analyzer()
    if pa is None:
        print(f"perf_analyzer not found: run {perf.INSTALL_HINT}", file=sys.stderr)
        return 1
    budgets = [int(b) for b in args.budgets.split(",")]
    repository = benchlib.example_repository([MODEL])
    model = benchlib.load_model_info(repository, MODEL)
    feed = model.sample(1, np.random.default_rng(3))
    log_dir = Path(__file__).parent / "results" / f"busy-poll-logs-{time.strftime('%H%M%S')}"
    load_before = benchlib.loadavg()
    rounds: dict[int, list[dict[str, Any]]] = {b: [] for b in budgets}
    with contextlib.ExitStack() as stack:
        servers = {}
        calls = {}
        for budget in budgets:
            flags = ["--model-control-mode=explicit", f"--load-model={MODEL}"]
            flags.append(f"--http-busy-poll-us={budget}")
            servers[budget] = stack.enter_context(
                benchlib.oceanus_server(repository, log_dir, tag=f"budget{budget}", extra=flags)
            )
            call, client = latency.http_caller(servers[budget].http_url, model, feed)
            stack.callback(client.close)
            calls[budget] = call
        for index in range(args.repeat):
            for budget in budgets:
                row = measure(servers[budget], pa, args.window_ms, calls[budget])
                rounds[budget].append(row)
                print(
                    f"round {index + 1} budget {budget:>5} us: perf_analyzer p50 "
                    f"{row['pa_p50_ms']:.3f} ms, {row['pa_infer_per_s']:,.0f} infer/s, server "
                    f"CPU {row['server_cpu_pct']:.0f} %; tritonclient.http p50 "
                    f"{row['tritonclient_p50_ms']:.3f} ms"
                )
    medians = {
        budget: {
            key: round(benchlib.median([r[key] for r in rows]), 4)
            for key in ("pa_p50_ms", "pa_infer_per_s", "server_cpu_pct", "tritonclient_p50_ms")
        }
        for budget, rows in rounds.items()
    }
    print(f"\n== simple at concurrency 1, medians of {args.repeat} rounds")
    print(
        benchlib.table(
            ["--http-busy-poll-us", "pa p50 ms", "pa infer/s", "server CPU %", "tc.http p50 ms"],
            [
                [
                    budget,
                    f"{m['pa_p50_ms']:.3f}",
                    f"{m['pa_infer_per_s']:,.0f}",
                    f"{m['server_cpu_pct']:.0f}",
                    f"{m['tritonclient_p50_ms']:.3f}",
                ]
                for budget, m in medians.items()
            ],
        )
    )
    benchlib.write_side_by_side(
        "busy-poll", args, load_before, medians=medians, rounds=rounds, logs=str(log_dir)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
