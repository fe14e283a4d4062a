"""Each model's own framework called in-process: the throughput limit and the single-call latency.

Two option sets per framework:

* ``server``: what Oceanus does, one runner per model instance, each on its own thread as the
  server's instance threads are, with the thread settings of the backend:

  - ONNX Runtime (oceanus/backends/onnxruntime.py): one session per instance,
    ``intra_op_num_threads = cores // instance_count``, ``inter_op_num_threads = 1``, sequential
    execution, spinning disabled;
  - PyTorch (oceanus/backends/pytorch/): one ``torch.jit.load`` module per instance, called
    under ``torch.inference_mode()``; each instance thread touches ATen and then calls
    ``torch.set_num_threads(cores // instance_count)`` (per-thread in PyTorch's OpenMP builds);
  - OpenVINO (oceanus/backends/openvino.py): the IR with a dynamic batch dimension, compiled once
    with the backend's properties (``NUM_STREAMS`` = instances, ``INFERENCE_NUM_THREADS`` = the
    instances' cores, f32, pinning off), one infer request per instance.

* ``default``: one runner with the framework's defaults (ONNX Runtime: all cores, spinning on;
  PyTorch: ``torch.set_num_threads`` left at its start-up value, the cores; OpenVINO:
  ``compile_model(model, "CPU")`` with only ``INFERENCE_PRECISION_HINT: f32``, since OpenVINO
  picks bf16 by itself on CPUs that have it and the backend serves f32 unless ``HINT_BF16``).

    python bench/inproc.py --models resnet50_onnx --batches 1,8 --seconds 2
    python bench/inproc.py --models resnet_small_pytorch,resnet50_openvino --batches 1,8,16,32
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable
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


class Runner:
    """One model instance as the benchmark drives it: ``setup()`` runs on the thread that will
    call it (per-thread settings), ``bind(feed)`` returns the zero-argument call to time."""

    threads: int | str = "default"

    def setup(self) -> None:
        pass

    def bind(self, feed: dict[str, np.ndarray]) -> Callable[[], Any]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class OrtRunner(Runner):
    def __init__(self, session: ort.InferenceSession, threads: int | str) -> None:
        self.session = session
        self.threads = threads

    def bind(self, feed: dict[str, np.ndarray]) -> Callable[[], Any]:
        session = self.session
        return lambda: session.run(None, feed)


_TORCH_DEFAULT_THREADS: list[int] = []


def _torch() -> Any:
    import torch

    if not _TORCH_DEFAULT_THREADS:  # the start-up value, before any set_num_threads here
        _TORCH_DEFAULT_THREADS.append(torch.get_num_threads())
    return torch


class TorchRunner(Runner):
    """A TorchScript module called as oceanus/backends/pytorch.py calls it."""

    def __init__(self, model: benchlib.ModelInfo, threads: int | None) -> None:
        torch = _torch()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # TorchScript is deprecated
            self.module = torch.jit.load(str(model.path), map_location="cpu").eval()
        self.names = [t.name for t in model.inputs]  # the example models: <name>__<index>
        self.set_threads = threads
        self.threads = threads or f"default ({_TORCH_DEFAULT_THREADS[0]})"

    def setup(self) -> None:
        torch = _torch()
        torch.get_num_threads()  # ATen sizes this thread's OpenMP team first (as the backend)
        # The backend's per-instance size; the default set restores the start-up value, which an
        # earlier server-set run on another thread may have changed as the default for new threads.
        torch.set_num_threads(self.set_threads or _TORCH_DEFAULT_THREADS[0])

    def bind(self, feed: dict[str, np.ndarray]) -> Callable[[], Any]:
        torch = _torch()
        tensors = [torch.from_numpy(np.array(feed[name], order="C")) for name in self.names]
        module = self.module

        def call() -> Any:
            with torch.inference_mode():
                return module(*tensors)

        return call

    def close(self) -> None:
        self.module = None


class OpenVinoRunner(Runner):
    """One infer request on a compiled model shared by the instances (as the backend does)."""

    def __init__(self, compiled: Any, threads: int | str) -> None:
        self.compiled = compiled
        self.request = compiled.create_infer_request()
        self.threads = threads

    def bind(self, feed: dict[str, np.ndarray]) -> Callable[[], Any]:
        request = self.request
        return lambda: request.infer(feed, share_inputs=True, share_outputs=False)

    def close(self) -> None:
        self.request = None
        self.compiled = None


def _read_config(model: benchlib.ModelInfo) -> Any:
    from oceanus.core.repository import model_config

    assert model.config_path is not None
    return model_config.read_config_file(model.config_path)


def openvino_compiled(model: benchlib.ModelInfo, options: str) -> tuple[Any, dict[str, Any]]:
    """The IR with a dynamic batch dimension, compiled with the backend's properties (server)
    or with OpenVINO's defaults but f32 (default): on CPUs with AVX512_BF16 or AMX OpenVINO's
    own default is bf16 (2x ResNet-50 on the dev machine's EPYC), while the backend serves f32
    unless HINT_BF16 asks, so a bf16 "limit" would compare precisions, not serving."""
    import openvino as ov

    core = ov.Core()
    ir = core.read_model(str(model.path))
    if model.max_batch_size > 0:
        ir.reshape(
            {
                t.name: ov.PartialShape([ov.Dimension(), *(ov.Dimension(d) for d in t.dims)])
                for t in model.inputs
            }
        )
    properties: dict[str, Any] = {"INFERENCE_PRECISION_HINT": "f32"}
    if options == "server":
        from oceanus.backends.openvino import OpenVinoBackend

        properties = OpenVinoBackend()._device_properties(
            _read_config(model), model.instance_count, server_threads(model) * model.instance_count
        )
    compiled = core.compile_model(ir, "CPU", properties)
    return compiled, properties


def server_threads(model: benchlib.ModelInfo) -> int:
    """Each instance's share of the cores, as oceanus/core/repository/loader.py computes it."""
    return max(1, (os.cpu_count() or 1) // max(1, model.instance_count))


def make_runners(model: benchlib.ModelInfo, options: str) -> list[Runner]:
    if options not in ("server", "default"):
        raise ValueError(options)
    instances = model.instance_count if options == "server" else 1
    if model.backend == "onnxruntime":
        return [
            OrtRunner(s, server_threads(model) if options == "server" else "default")
            for s in make_sessions(model, options)
        ]
    if model.backend == "pytorch":
        threads = server_threads(model) if options == "server" else None
        return [TorchRunner(model, threads) for _ in range(instances)]
    if model.backend == "openvino":
        compiled, properties = openvino_compiled(model, options)
        label: int | str = (
            f"{properties.get('INFERENCE_NUM_THREADS')} over {properties.get('NUM_STREAMS')} "
            "stream(s)"
            if options == "server"
            else f"default ({compiled.get_property('INFERENCE_NUM_THREADS')} threads, "
            f"{compiled.get_property('NUM_STREAMS')} stream(s))"
        )
        return [OpenVinoRunner(compiled, label) for _ in range(instances)]
    raise ValueError(f"no in-process runner for backend {model.backend!r}")


def framework_versions() -> dict[str, str]:
    """Versions of the frameworks that are installed (for the JSON's meta)."""
    import importlib.metadata

    out = {}
    for package in ("onnxruntime", "torch", "openvino"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[package] = importlib.metadata.version(package)
    return out


def _throughput(
    runners: list[Runner],
    feed: dict[str, np.ndarray],
    batch: int,
    seconds: float,
    warm_up: bool = True,
    warm_up_runs: int = 1,
) -> dict[str, Any]:
    """Every runner calls *feed* in a loop on its own thread for about *seconds* (at least one
    timed run each, after *warm_up_runs* warm-up runs each unless *warm_up* is false)."""
    counts = [0] * len(runners)
    ends = [0.0] * len(runners)
    barrier = threading.Barrier(len(runners) + 1)
    start_box: list[float] = []
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        try:
            runner = runners[index]
            runner.setup()
            call = runner.bind(feed)
            if warm_up:
                for _ in range(warm_up_runs):
                    call()  # arena allocation, first-run kernels, the JIT's profiling runs
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()
            return
        barrier.wait()
        barrier.wait()
        deadline = start_box[0] + seconds
        while True:
            call()
            counts[index] += 1
            now = time.perf_counter()
            if now >= deadline:
                ends[index] = now
                return

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(len(runners))]
    for thread in threads:
        thread.start()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        for thread in threads:
            thread.join()
        raise errors[0] if errors else RuntimeError("in-process worker failed") from None
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
        "ms_per_run": 1000 * elapsed * len(runners) / runs,
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
    # TorchScript's profiling executor optimizes a graph on its second run.
    warm_up_runs = 2 if model.backend == "pytorch" else 1
    for options in option_sets:
        runners = make_runners(model, options)
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
                        "framework": model.backend,
                        "options": options,
                        "batch": batch,
                        "skipped": f"expected {expected_ms / 1000:.1f} s per run",
                    }
                )
                continue
            row = _throughput(
                runners,
                feed,
                batch,
                seconds,
                warm_up=expected_ms < 1000 * seconds,
                warm_up_runs=warm_up_runs,
            )
            previous = (batch, row["ms_per_run"])
            row.update(
                model=model.name,
                framework=model.backend,
                options=options,
                sessions=len(runners),
                intra_op_threads=runners[0].threads,
            )
            log(
                f"  in-process {model.name} {options:7s} batch {batch:3d}: "
                f"{row['samples_per_s']:9.1f}/s ({row['ms_per_run']:.2f} ms/run)"
            )
            results.append(row)
        for runner in runners:
            runner.close()
        del runners
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
