"""ONNX Runtime called in-process: the throughput limit and the single-call latency.

Two option sets:

* ``server``: what Oceanus does (oceanus/backends/onnxruntime.py): one session per model
  instance, ``intra_op_num_threads = cores // instance_count``, ``inter_op_num_threads = 1``,
  sequential execution, spinning disabled; the instances run at the same time, each on its own
  thread, as the server's instance threads do.
* ``default``: one session with ONNX Runtime's default options (all cores, spinning on).

    python bench/inproc.py --models resnet50_onnx --batches 1,8 --seconds 2
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib


def server_session_options(instance_count: int) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, (os.cpu_count() or 1) // max(1, instance_count))
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return options


def make_sessions(model: benchlib.ModelInfo, options: str) -> list[ort.InferenceSession]:
    providers = ["CPUExecutionProvider"]
    if options == "server":
        return [
            ort.InferenceSession(
                str(model.path),
                sess_options=server_session_options(model.instance_count),
                providers=providers,
            )
            for _ in range(model.instance_count)
        ]
    if options == "default":
        return [ort.InferenceSession(str(model.path), providers=providers)]
    raise ValueError(options)


def _throughput(
    sessions: list[ort.InferenceSession],
    feed: dict[str, np.ndarray],
    batch: int,
    seconds: float,
    warm_up: bool = True,
) -> dict[str, Any]:
    """Every session runs *feed* in a loop on its own thread for about *seconds* (at least one
    timed run each, after one warm-up run each unless *warm_up* is false)."""
    counts = [0] * len(sessions)
    ends = [0.0] * len(sessions)
    barrier = threading.Barrier(len(sessions) + 1)
    start_box: list[float] = []

    def worker(index: int) -> None:
        session = sessions[index]
        if warm_up:
            session.run(None, feed)  # arena allocation, first-run kernels
        barrier.wait()
        barrier.wait()
        deadline = start_box[0] + seconds
        while True:
            session.run(None, feed)
            counts[index] += 1
            now = time.perf_counter()
            if now >= deadline:
                ends[index] = now
                return

    threads = [
        threading.Thread(target=worker, args=(i,), daemon=True) for i in range(len(sessions))
    ]
    for thread in threads:
        thread.start()
    barrier.wait()
    start_box.append(time.perf_counter())
    barrier.wait()
    for thread in threads:
        thread.join()
    elapsed = max(ends) - start_box[0]
    runs = sum(counts)
    return {
        "batch": batch,
        "runs": runs,
        "seconds": round(elapsed, 3),
        "samples_per_s": runs * batch / elapsed,
        "ms_per_run": 1000 * elapsed * len(sessions) / runs,
        "warmed_up": warm_up,
    }


def throughput(
    model: benchlib.ModelInfo,
    batches: list[int],
    seconds: float,
    option_sets: tuple[str, ...] = ("server", "default"),
    seed: int = 0,
    log: Any = print,
    max_run_s: float | None = None,
) -> list[dict[str, Any]]:
    """Samples/s per option set and batch size. A batch size whose single run is expected (from
    the previous one) to take longer than *max_run_s* (default 4 x *seconds*) is skipped."""
    max_run_s = max_run_s or 4 * seconds
    results = []
    rng = np.random.default_rng(seed)
    for options in option_sets:
        sessions = make_sessions(model, options)
        previous: tuple[int, float] | None = None  # (batch, ms per run)
        for batch in batches:
            feed = model.sample(batch, rng)
            # A warm-up run at this batch size, unless one run is expected to outlast the window
            # (ResNet-50 at batch 64 on a busy 2-core machine: 10-20 s); the first run then
            # counts, which costs a few percent.
            expected_ms = previous[1] * batch / previous[0] if previous else 0.0
            if expected_ms > 1000 * max_run_s:
                log(
                    f"  in-process {model.name} {options:7s} batch {batch:3d}: skipped, one run "
                    f"would take ~{expected_ms / 1000:.0f} s (> {max_run_s:.0f} s) right now"
                )
                results.append(
                    {
                        "model": model.name,
                        "options": options,
                        "batch": batch,
                        "skipped": f"expected {expected_ms / 1000:.1f} s per run",
                    }
                )
                continue
            row = _throughput(sessions, feed, batch, seconds, warm_up=expected_ms < 1000 * seconds)
            previous = (batch, row["ms_per_run"])
            row.update(
                model=model.name,
                options=options,
                sessions=len(sessions),
                intra_op_threads=(
                    max(1, (os.cpu_count() or 1) // model.instance_count)
                    if options == "server"
                    else "default"
                ),
            )
            log(
                f"  in-process {model.name} {options:7s} batch {batch:3d}: "
                f"{row['samples_per_s']:9.1f}/s ({row['ms_per_run']:.2f} ms/run)"
            )
            results.append(row)
        del sessions
    return results


def call_latencies(
    session: ort.InferenceSession, feed: dict[str, np.ndarray], count: int
) -> list[float]:
    """Seconds per sequential ``session.run`` on *feed* (*count* calls)."""
    out = []
    for _ in range(count):
        start = time.perf_counter()
        session.run(None, feed)
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50_onnx,text_classifier_onnx,simple")
    parser.add_argument("--batches", default="1,8,16,32,64")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--options", default="server,default")
    args = parser.parse_args()
    names = args.models.split(",")
    repository = benchlib.example_repository(names)
    for name in names:
        model = benchlib.load_model_info(repository, name)
        limit = max(1, model.max_batch_size)
        batches = [int(b) for b in args.batches.split(",") if int(b) <= limit]
        throughput(model, batches, args.seconds, tuple(args.options.split(",")))


if __name__ == "__main__":
    main()
