"""The in-process API against HTTP, and Ray Serve's proxy against Oceanus directly, side by side
in one run (docs/embedded.md, docs/ray.md).

1. `simple`, one request at a time: `oceanus.Server.model("simple").infer()` in this process
   against the same request with tritonclient.http to a local `python -m oceanus`
   (--frontend-workers=0). Rounds alternate; medians of the per-round µs per request.
2. With `--ray`: a one-node Ray cluster on loopback (`ray start --head`, deploy/ray's config
   with one replica) and a direct `python -m oceanus` on the same repository; per model
   (`simple`, `resnet50_onnx`): tritonclient.http one at a time (µs per request; the proxy's
   overhead is the difference) and `--threads` clients for `--window-s` (infer/s; the ratio).

The machine is shared (other jobs run beside it): compare within one run, not across runs.

    python bench/embedded.py [--repeat 5] [--ray] [--threads 4] [--window-s 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http as httpclient
import yaml

sys.path.insert(0, str(Path(__file__).parent))
import benchlib

import oceanus

ROOT = Path(__file__).resolve().parents[1]
LOGS = Path(tempfile.gettempdir()) / "oceanus-bench-embedded"


def per_request_us(call: Callable[[], object], count: int) -> float:
    started = time.perf_counter()
    for _ in range(count):
        call()
    return (time.perf_counter() - started) / count * 1e6


def http_call(url: str, model: str, inputs: dict[str, np.ndarray]) -> Callable[[], object]:
    client = httpclient.InferenceServerClient(url, network_timeout=120)
    items = []
    for name, array in inputs.items():
        item = httpclient.InferInput(
            name, list(array.shape), "INT32" if array.dtype == np.int32 else "FP32"
        )
        item.set_data_from_numpy(array, binary_data=True)
        items.append(item)
    return lambda: client.infer(model, items)


def throughput(
    url: str, model: str, inputs: dict[str, np.ndarray], threads: int, window_s: float
) -> float:
    done = [0] * threads
    stop = threading.Event()

    def run(index: int) -> None:
        call = http_call(url, model, inputs)
        while not stop.is_set():
            call()
            done[index] += 1

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    time.sleep(window_s)
    stop.set()
    for worker in workers:
        worker.join()
    return sum(done) / window_s


def embedded_vs_http(args: argparse.Namespace) -> dict[str, Any]:
    repository = benchlib.example_repository(["simple"])
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = {"INPUT0": a, "INPUT1": a}
    embedded, over_http = [], []
    with oceanus.Server(model_repository=repository, log_info=False) as server:
        model = server.model("simple")

        def embedded_call() -> object:
            return list(model.infer(inputs=inputs))

        with benchlib.oceanus_server(repository, LOGS, extra=["--frontend-workers=0"]) as direct:
            http = http_call(direct.http_url, "simple", inputs)
            per_request_us(embedded_call, 200)
            per_request_us(http, 200)
            for _ in range(args.repeat):
                embedded.append(per_request_us(embedded_call, 2000))
                over_http.append(per_request_us(http, 1000))
    result: dict[str, Any] = {
        "embedded_us": benchlib.median(embedded),
        "http_us": benchlib.median(over_http),
        "rounds_embedded_us": embedded,
        "rounds_http_us": over_http,
    }
    result["ratio"] = result["http_us"] / result["embedded_us"]
    return result


def ray_vs_direct(args: argparse.Namespace) -> dict[str, Any]:
    models = ["simple", "resnet50_onnx"]
    repository = benchlib.example_repository(models)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    temp = Path(tempfile.mkdtemp(prefix="oceanus-ray-bench-", dir="/tmp"))
    gcs_port, proxy_port = benchlib.free_port(), benchlib.free_port()
    gcs = f"127.0.0.1:{gcs_port}"
    results: dict[str, Any] = {}
    subprocess.run(
        ["ray", "start", "--head", "--node-ip-address=127.0.0.1", f"--port={gcs_port}",
         "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats",
         "--object-store-memory=80000000", f"--temp-dir={temp}"],
        env=env, check=True, capture_output=True,
    )  # fmt: skip
    try:
        config = yaml.safe_load((ROOT / "deploy" / "ray" / "serve_config.yaml").read_text())
        config["http_options"] = {"host": "127.0.0.1", "port": proxy_port}
        app = config["applications"][0]
        app["args"] = {"model_repository": str(repository), "server_options": {"log_info": False}}
        app["deployments"][0].update({"num_replicas": 1, "autoscaling_config": None})
        path = temp / "serve_config.yaml"
        path.write_text(yaml.safe_dump(config))
        subprocess.run(
            ["serve", "run", "--non-blocking", f"--address={gcs}", str(path)],
            env=env, check=True, capture_output=True, timeout=300,
        )  # fmt: skip
        proxy = f"127.0.0.1:{proxy_port}"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpclient.InferenceServerClient(proxy).is_model_ready("resnet50_onnx"):
                    break
            except Exception:
                pass
            time.sleep(1)
        rng = np.random.default_rng(0)
        samples: dict[str, dict[str, np.ndarray]] = {
            "simple": {"INPUT0": np.ones((1, 16), np.int32), "INPUT1": np.ones((1, 16), np.int32)},
            "resnet50_onnx": {"input": rng.random((1, 3, 224, 224), dtype=np.float32)},
        }
        counts = {"simple": 500, "resnet50_onnx": 20}
        with benchlib.oceanus_server(repository, LOGS, extra=["--frontend-workers=0"]) as direct:
            for model in models:
                inputs, count = samples[model], counts[model]
                rows: dict[str, list[float]] = {
                    k: [] for k in ("proxy_us", "direct_us", "proxy_rps", "direct_rps")
                }
                for _ in range(args.repeat):
                    rows["proxy_us"].append(per_request_us(http_call(proxy, model, inputs), count))
                    rows["direct_us"].append(
                        per_request_us(http_call(direct.http_url, model, inputs), count)
                    )
                    rows["proxy_rps"].append(
                        throughput(proxy, model, inputs, args.threads, args.window_s)
                    )
                    rows["direct_rps"].append(
                        throughput(direct.http_url, model, inputs, args.threads, args.window_s)
                    )
                medians = {k: benchlib.median(v) for k, v in rows.items()}
                medians["overhead_us"] = medians["proxy_us"] - medians["direct_us"]
                medians["throughput_ratio"] = medians["proxy_rps"] / medians["direct_rps"]
                results[model] = {**medians, "rounds": rows}
    finally:
        subprocess.run(
            ["serve", "shutdown", "-y", f"--address={gcs}"],
            env=env,
            capture_output=True,
            check=False,
        )
        subprocess.run(["ray", "stop"], env=env, capture_output=True, check=False)
        shutil.rmtree(temp, ignore_errors=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--ray", action="store_true", help="also Ray Serve's proxy vs direct")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--window-s", type=float, default=3.0)
    args = parser.parse_args()
    args.concurrency, args.window_ms = args.threads, int(args.window_s * 1000)
    load_before = benchlib.loadavg()
    LOGS.mkdir(exist_ok=True)
    inproc = embedded_vs_http(args)
    print("simple, one request at a time (medians of", args.repeat, "rounds; shared machine)")
    faster = f"{inproc['ratio']:.1f}x faster"
    print(benchlib.table(
        ["path", "µs/request", "vs HTTP"],
        [["embedded infer()", benchlib.fmt_num(inproc["embedded_us"]), faster],
         ["HTTP (tritonclient)", benchlib.fmt_num(inproc["http_us"]), "1.0x"]],
    ))  # fmt: skip
    ray: dict[str, Any] = {}
    if args.ray:
        ray = ray_vs_direct(args)
        rows = [
            [model, benchlib.fmt_num(r["direct_us"]), benchlib.fmt_num(r["proxy_us"]),
             benchlib.fmt_num(r["overhead_us"]), benchlib.fmt_num(r["direct_rps"]),
             benchlib.fmt_num(r["proxy_rps"]), f"{r['throughput_ratio']:.2f}"]
            for model, r in ray.items()
        ]  # fmt: skip
        print(f"Ray Serve proxy vs Oceanus direct (tritonclient.http; {args.threads} threads)")
        print(benchlib.table(
            ["model", "direct µs", "proxy µs", "overhead µs", "direct /s", "proxy /s", "ratio"],
            rows,
        ))  # fmt: skip
    benchlib.write_side_by_side("embedded", args, load_before, embedded_vs_http=inproc, ray=ray)
    return 0


if __name__ == "__main__":
    sys.exit(main())
