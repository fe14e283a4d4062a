"""The core's own path, in process: ServerCore.infer on the example `simple` (no batching: a lone
request executes in place) and `simple_dyna` (dynamic batching), no frontend, no sockets.

What it is for: changes to the scheduler's hot path (core/scheduling/dynamic_batch.py,
core/scheduling/instance.py,
core/clock.py) measured before and after, side by side. With `--trees A,B` each round runs this
script once per tree (PYTHONPATH=<tree>), alternating, so machine noise hits both alike; the table
gives medians and the ratio B/A.

    python bench/investigations/core_path.py [--requests 20000] [--rounds 5] [--trees ../main,.]

Phases per run: `simple` at concurrency 1 (µs per request: validation, queue, in-place
execution of a tiny ONNX graph, response), `simple_dyna` at concurrency 16 (requests/s, batches
forming on the loop), each also as process CPU time per request (less sensitive than wall time
to other work on a shared machine). Results: bench/results/core-path-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent.parent  # bench/


async def _measure(requests: int) -> dict[str, float]:
    import numpy as np

    from oceanus.backends import builtin
    from oceanus.core.server import CoreOptions, ServerCore
    from oceanus.core.types import InferRequest, Tensor
    from oceanus.examples import example_repository

    repository = example_repository(["simple", "simple_dyna"])
    core = ServerCore(
        CoreOptions([repository], backends=builtin.registry(entry_points=False), load_threads=2)
    )
    await core.start()
    data = np.arange(16, dtype=np.int32).reshape(1, 16)

    def request(model: str) -> InferRequest:
        tensors = [Tensor(name, "INT32", (1, 16), data) for name in ("INPUT0", "INPUT1")]
        return InferRequest(model, inputs=tensors)

    async def sequential(model: str, count: int) -> None:
        for _ in range(count):
            await core.infer(request(model), "bench")

    try:
        await sequential("simple", 1000)  # warm-up: the instance moves onto the loop
        await asyncio.gather(*(sequential("simple_dyna", 100) for _ in range(16)))
        started, cpu = time.perf_counter(), time.process_time()
        await sequential("simple", requests)
        c1_us = (time.perf_counter() - started) / requests * 1e6
        c1_cpu_us = (time.process_time() - cpu) / requests * 1e6
        per_client = requests // 16
        started, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(sequential("simple_dyna", per_client) for _ in range(16)))
        c16_rps = per_client * 16 / (time.perf_counter() - started)
        c16_cpu_us = (time.process_time() - cpu) / (per_client * 16) * 1e6
    finally:
        await core.shutdown()
    return {
        "simple_c1_us": c1_us,
        "simple_c1_cpu_us": c1_cpu_us,
        "simple_dyna_c16_rps": c16_rps,
        "simple_dyna_c16_cpu_us": c16_cpu_us,
    }


def _child(requests: int) -> None:
    try:
        import uvloop

        result = uvloop.run(_measure(requests))
    except ImportError:
        result = asyncio.run(_measure(requests))
    print(json.dumps(result))


def _run_tree(tree: Path, requests: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    output = subprocess.run(
        [
            sys.executable,
            str(BENCH_DIR / "investigations" / "core_path.py"),
            "--child",
            "--requests",
            str(requests),
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, float] = json.loads(output.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--trees", default=".", help="comma-separated checkouts to compare")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.requests)
        return
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    runs: dict[str, list[dict[str, float]]] = {str(t): [] for t in trees}
    for round_number in range(args.rounds):
        for tree in trees if round_number % 2 == 0 else list(reversed(trees)):
            runs[str(tree)].append(_run_tree(tree, args.requests))
    metrics = ["simple_c1_us", "simple_c1_cpu_us", "simple_dyna_c16_rps", "simple_dyna_c16_cpu_us"]
    medians = {
        name: {m: statistics.median(r[m] for r in results) for m in metrics}
        for name, results in runs.items()
    }
    heads = ["simple c=1 us", "(cpu us)", "simple_dyna c=16 req/s", "(cpu us/req)"]
    print(f"{'medians':34}" + "".join(f"{h:>24}" for h in heads))
    for name, values in medians.items():
        print(f"{name[-34:]:34}" + "".join(f"{values[m]:24.1f}" for m in metrics))
    if len(trees) == 2:
        a, b = (medians[str(t)] for t in trees)
        print(f"{'ratio (second / first)':34}" + "".join(f"{b[m] / a[m]:24.3f}" for m in metrics))
    load = os.getloadavg()
    print(f"load average during the run: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    results_dir = BENCH_DIR / "results"
    results_dir.mkdir(exist_ok=True)
    out = results_dir / f"core-path-{time.strftime('%Y%m%d-%H%M%S')}.json"
    record: dict[str, Any] = {
        "requests": args.requests,
        "rounds": args.rounds,
        "runs": runs,
        "medians": medians,
        "loadavg": load,
    }
    out.write_text(json.dumps(record, indent=1))
    print(f"wrote {out.relative_to(BENCH_DIR.parent)}")


if __name__ == "__main__":
    main()
