"""Start-up time and single-request latency.

(a) start-to-ready: ``python -m oceanus`` with no ``--model-repository`` (the built-in example
    repository), from process start until ``GET /v2/health/ready`` answers 200; median of N.
(b) single-request latency: sequential requests (one in flight) to ``simple`` and
    ``resnet50_onnx`` over HTTP (tritonclient.http, binary tensors in and out) and gRPC
    (tritonclient.grpc, when the gRPC port answers), against ``session.run`` called in-process on
    the same input (server session options, and ONNX Runtime's defaults). The three are measured
    in interleaved rounds so that machine noise hits them alike; p50 over all rounds.

    python bench/latency.py [--quick] [--skip-startup] [--models simple,resnet50_onnx]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib
import inproc


def start_to_ready(runs: int, log_dir: Path, log: Any = print) -> dict[str, Any]:
    times = []
    argv: list[str] = []
    for index in range(runs):
        http_port, grpc_port = benchlib.free_port(), benchlib.free_port()
        argv = benchlib.oceanus_argv(None, http_port, grpc_port)
        log_path = log_dir / f"startup-{index}.log"
        log_dir.mkdir(parents=True, exist_ok=True)
        with log_path.open("wb") as handle:
            started = time.perf_counter()
            proc = subprocess.Popen(
                argv, cwd=benchlib.ROOT, stdout=handle, stderr=subprocess.STDOUT
            )
        try:
            benchlib.wait_http_ok(
                f"http://127.0.0.1:{http_port}/v2/health/ready", proc, timeout=180, interval=0.02
            )
            elapsed = time.perf_counter() - started
        finally:
            benchlib.stop_process(proc)
        times.append(elapsed)
        log(f"  start-to-ready run {index + 1}: {elapsed:.2f} s")
    return {
        "command": " ".join(["python", *argv[1:]]),
        "runs_s": [round(t, 3) for t in times],
        "median_s": round(benchlib.median(times), 3),
    }


def http_caller(url: str, model: benchlib.ModelInfo, feed: dict[str, np.ndarray]) -> Any:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url, connection_timeout=300, network_timeout=300)
    inputs = []
    for name, array in feed.items():
        tensor = httpclient.InferInput(name, list(array.shape), benchlib.TRITON_DTYPES[array.dtype])
        tensor.set_data_from_numpy(array, binary_data=True)
        inputs.append(tensor)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=True) for n in model.outputs]

    def call() -> None:
        client.infer(model.name, inputs, outputs=outputs)

    return call, client


def _grpc_caller(url: str, model: benchlib.ModelInfo, feed: dict[str, np.ndarray]) -> Any:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    if not client.is_server_ready(client_timeout=5):
        raise RuntimeError("gRPC server not ready")
    inputs = []
    for name, array in feed.items():
        tensor = grpcclient.InferInput(name, list(array.shape), benchlib.TRITON_DTYPES[array.dtype])
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    outputs = [grpcclient.InferRequestedOutput(n) for n in model.outputs]

    def call() -> None:
        client.infer(model.name, inputs, outputs=outputs, client_timeout=300)

    return call, client


def timed(call: Any, count: int, budget_s: float = float("inf")) -> list[float]:
    """Seconds per sequential call: *count* calls, fewer if they take more than *budget_s*."""
    out: list[float] = []
    began = time.perf_counter()
    for _ in range(count):
        start = time.perf_counter()
        call()
        out.append(time.perf_counter() - start)
        if start - began > budget_s:
            break
    return out


def single_request(
    server: benchlib.Server,
    repository: Path,
    models: list[str],
    counts: dict[str, int],
    rounds: int = 4,
    use_grpc: bool = True,
    log: Any = print,
    budget_s: float = 60.0,
) -> dict[str, Any]:
    """*budget_s*: the most seconds per model (all ways and rounds together); a round of a way
    stops early when its share is spent (ResNet-50 on a busy machine: 100-300 ms per call)."""
    results: dict[str, Any] = {}
    for name in models:
        model = benchlib.load_model_info(repository, name)
        feed = model.sample(1, np.random.default_rng(3))
        count = counts.get(name, 200)
        per_round = max(1, count // rounds)
        ways: dict[str, Any] = {}
        clients = []
        server_session = inproc.make_sessions(model, "server")[0]
        default_session = inproc.make_sessions(model, "default")[0]
        ways["inproc_server_opts"] = lambda s=server_session, f=feed: s.run(None, f)
        ways["inproc_default"] = lambda s=default_session, f=feed: s.run(None, f)
        call, client = http_caller(server.http_url, model, feed)
        ways["http"] = call
        # The HTTP floor: the same client asking GET /v2/health/ready (no model, no tensors).
        ways["http_ready_floor"] = lambda c=client: c.is_server_ready()
        clients.append(client)
        grpc_error = None
        if use_grpc and server.grpc_url:
            try:
                call, client = _grpc_caller(server.grpc_url, model, feed)
                ways["grpc"] = call
                clients.append(client)
            except Exception as err:
                grpc_error = f"{type(err).__name__}: {err}"
        samples: dict[str, list[float]] = {way: [] for way in ways}
        share = budget_s / (rounds * len(ways))
        for call in ways.values():  # warm-up
            timed(call, max(3, per_round // 10), share / 4)
        for _ in range(rounds):
            for way, call in ways.items():
                samples[way].extend(timed(call, per_round, share))
        for client in clients:
            client.close()
        row: dict[str, Any] = {"requests_per_way": {w: len(v) for w, v in samples.items()}}
        for way, values in samples.items():
            row[way] = {
                "p50_ms": round(benchlib.percentile(values, 50) * 1000, 4),
                "p90_ms": round(benchlib.percentile(values, 90) * 1000, 4),
                "mean_ms": round(float(np.mean(values)) * 1000, 4),
            }
        base = row["inproc_server_opts"]["p50_ms"]
        for way in ("http", "grpc"):
            if way in row:
                row[f"{way}_adds_ms"] = round(row[way]["p50_ms"] - base, 4)
        if grpc_error:
            row["grpc_error"] = grpc_error
        results[name] = row
        parts = ", ".join(f"{w} {row[w]['p50_ms']:.3f}" for w in ways)
        log(f"  single-request p50 ms {name}: {parts}")
    return results


def run(
    quick: bool,
    log_dir: Path,
    models: list[str] | None = None,
    startup: bool = True,
    use_grpc: bool = True,
    log: Any = print,
) -> dict[str, Any]:
    models = models or ["simple", "resnet50_onnx"]
    out: dict[str, Any] = {}
    if startup:
        log("start-to-ready (default example repository):")
        out["start_to_ready"] = start_to_ready(3, log_dir, log)
    repository = benchlib.example_repository(models)
    counts = {"simple": 200, "resnet50_onnx": 40 if quick else 200}
    counts.update({m: 100 if quick else 200 for m in models if m not in counts})
    with benchlib.oceanus_server(repository, log_dir, tag="oceanus-latency") as server:
        out["single_request"] = single_request(
            server,
            repository,
            models,
            counts,
            use_grpc=use_grpc,
            log=log,
            budget_s=30.0 if quick else 60.0,
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--skip-startup", action="store_true")
    parser.add_argument("--no-grpc", action="store_true")
    parser.add_argument("--models", default="simple,resnet50_onnx")
    args = parser.parse_args()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_dir = benchlib.RESULTS_DIR / f"{stamp}-latency-logs"
    result = run(
        args.quick,
        log_dir,
        args.models.split(","),
        startup=not args.skip_startup,
        use_grpc=not args.no_grpc,
    )
    benchlib.RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = benchlib.RESULTS_DIR / f"{stamp}-latency.json"
    path.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    print(f"written {path}")


if __name__ == "__main__":
    main()
