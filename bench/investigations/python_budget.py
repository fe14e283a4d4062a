"""One Python model request's round trip, in process: where its microseconds go.

Drives ServerCore.infer (no frontend, no sockets but the stub's) on the identity model.py of
bench/python_backend.py, one request per execute (`identity_one`) and, with `--inproc`, the
same model with `oceanus_in_process`. Per request it gives the wall time at concurrency 1 and
16, and for each process (the server; the stub) the CPU time, split by thread in the server
(event loop, instance thread, the rest), and the voluntary context switches (each one sleep, so
one wake-up paid later), read from /proc before and after a fixed number of requests.

    python bench/investigations/python_budget.py [--requests 5000] [--rounds 3] [--trees ../main,.]
    python bench/investigations/python_budget.py --child --requests 20000 --hold 10  # py-spy

With `--trees A,B` each round runs once per tree (PYTHONPATH=<tree>), alternating; the table
gives medians and the ratio B/A. `--hold S`: the child prints its pid and the stub's, waits S
seconds (attach py-spy or strace -c -f -p then), and serves the requests at concurrency 1.
Results: bench/results/python-budget-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent.parent  # bench/
sys.path.insert(0, str(BENCH_DIR))
TICK = os.sysconf("SC_CLK_TCK")

import benchlib  # noqa: E402 - bench/ is on the path above


def _task_stats(pid: int) -> dict[int, tuple[str, float, int]]:
    """tid -> (thread name, CPU seconds, voluntary context switches) for a process's threads."""
    out: dict[int, tuple[str, float, int]] = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            stat = (task / "stat").read_text()
            status = (task / "status").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / TICK
        switches = 0
        for line in status.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                switches = int(line.split()[1])
        out[int(task.name)] = (name, cpu, switches)
    return out


def _stub_pid(pid: int) -> int | None:
    """The stub process (a child of whichever server thread started it)."""
    children = benchlib.child_pids(pid)
    return children[0] if children else None


async def _measure(requests: int, models: list[str], hold: float) -> dict[str, float]:
    import numpy as np

    from oceanus.backends import builtin
    from oceanus.core.server import CoreOptions, ServerCore
    from oceanus.core.types import InferRequest, Tensor

    # After oceanus: benchlib (imported by python_backend) puts this checkout on sys.path, and
    # --trees measures the oceanus of PYTHONPATH.
    python_backend = importlib.import_module("python_backend")

    tmp = tempfile.TemporaryDirectory(prefix="oceanus-pybudget-")
    repository = python_backend.write_repository(Path(tmp.name), models)
    core = ServerCore(CoreOptions([repository], backends=builtin.registry(entry_points=False)))
    await core.start()
    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    loop_tid = threading.get_native_id()
    pid = os.getpid()
    result: dict[str, float] = {}

    async def sequential(model: str, count: int) -> None:
        for _ in range(count):
            tensors = [Tensor("INPUT0", "FP32", (1, 16), data)]
            await core.infer(InferRequest(model, inputs=tensors), "bench")

    try:
        for model in models:
            await sequential(model, 500)  # warm-up
            stub = _stub_pid(pid)
            if hold:
                print(json.dumps({"server": pid, "stub": stub, "model": model}), flush=True)
                await asyncio.sleep(hold)
            before, stub_before = _task_stats(pid), _task_stats(stub) if stub else {}
            started = time.perf_counter()
            await sequential(model, requests)
            wall = time.perf_counter() - started
            after, stub_after = _task_stats(pid), _task_stats(stub) if stub else {}
            per = 1e6 / requests
            parts = {"loop": 0.0, "instance": 0.0, "other": 0.0}
            switches = {"loop": 0.0, "instance": 0.0, "other": 0.0}
            names = {t.native_id: t.name for t in threading.enumerate()}
            for tid, (name, cpu, sw) in after.items():
                _, cpu0, sw0 = before.get(tid, (name, 0.0, 0))
                instance = names.get(tid, "").startswith(model + "_")
                part = "loop" if tid == loop_tid else "instance" if instance else "other"
                parts[part] += (cpu - cpu0) * per
                switches[part] += (sw - sw0) / requests
            stub_cpu = sum(
                c - stub_before.get(t, ("", 0.0, 0))[1] for t, (_, c, _) in stub_after.items()
            )
            stub_sw = sum(
                s - stub_before.get(t, ("", 0.0, 0))[2] for t, (_, _, s) in stub_after.items()
            )
            result[f"{model}_c1_us"] = wall * per
            for part in parts:
                result[f"{model}_cpu_{part}_us"] = parts[part]
                result[f"{model}_wakeups_{part}"] = switches[part]
            result[f"{model}_cpu_stub_us"] = stub_cpu * per
            result[f"{model}_wakeups_stub"] = stub_sw / requests
            if hold:
                continue
            per_client = requests // 16
            started = time.perf_counter()
            await asyncio.gather(*(sequential(model, per_client) for _ in range(16)))
            result[f"{model}_c16_rps"] = per_client * 16 / (time.perf_counter() - started)
    finally:
        await core.shutdown()
        tmp.cleanup()
    return result


def _child(requests: int, models: list[str], hold: float) -> None:
    try:
        import uvloop

        result = uvloop.run(_measure(requests, models, hold))
    except ImportError:
        result = asyncio.run(_measure(requests, models, hold))
    print(json.dumps(result))


def _run_tree(tree: Path, requests: int, models: list[str]) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, str(BENCH_DIR / "investigations" / "python_budget.py"), "--child"]
    command += ["--requests", str(requests), "--models", ",".join(models)]
    # The stub starts with `python -m`, which puts the working directory before PYTHONPATH:
    # from the tree's root, it runs that tree's stub.
    output = subprocess.run(
        command, env=env, cwd=tree, check=True, capture_output=True, text=True
    ).stdout
    result: dict[str, float] = json.loads(output.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default="identity_one,identity_one_inproc")
    parser.add_argument("--trees", default=".", help="comma-separated checkouts to compare")
    parser.add_argument("--hold", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    models = [m for m in args.models.split(",") if m]
    if args.child:
        _child(args.requests, models, args.hold)
        return
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    runs: dict[str, list[dict[str, float]]] = {str(t): [] for t in trees}
    load_before = os.getloadavg()
    for round_number in range(args.rounds):
        for tree in trees if round_number % 2 == 0 else list(reversed(trees)):
            runs[str(tree)].append(_run_tree(tree, args.requests, models))
    metrics = sorted(runs[str(trees[0])][0])
    medians = {
        name: {m: statistics.median(r[m] for r in results) for m in metrics}
        for name, results in runs.items()
    }
    names = [str(t) for t in trees]
    print(f"{'medians of ' + str(args.rounds):40}" + "".join(f"{n[-22:]:>24}" for n in names))
    for m in metrics:
        line = f"{m:40}" + "".join(f"{medians[n][m]:24.1f}" for n in names)
        if len(names) == 2 and medians[names[0]][m]:
            line += f"{medians[names[1]][m] / medians[names[0]][m]:10.3f}"
        print(line)
    load = os.getloadavg()
    print(f"load average before {load_before[0]:.1f}, after {load[0]:.1f}")
    results_dir = BENCH_DIR / "results"
    results_dir.mkdir(exist_ok=True)
    out = results_dir / f"python-budget-{time.strftime('%Y%m%d-%H%M%S')}.json"
    record = {"args": vars(args), "runs": runs, "medians": medians, "loadavg": [load_before, load]}
    out.write_text(json.dumps(record, indent=1, default=str))
    print(f"wrote {out.relative_to(BENCH_DIR.parent)}")


if __name__ == "__main__":
    main()
