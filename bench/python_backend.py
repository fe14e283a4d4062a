"""An empty Python model served by Oceanus and by the reference Triton 2.51, side by side.

Issue 7's target: an identity model.py on 16 floats over HTTP at concurrency 16 serves
>= 3,000 infer/s with p50 < 5 ms, measured against the real Triton serving the same files in the
same run. Two variants of the model (the same model.py): `identity_dyna` (max_batch_size 16,
dynamic_batching {}: the batcher hands execute() several requests) and `identity_one`
(max_batch_size 0: one request per execute). The servers run one at a time, alternating, each
under perf_analyzer (HTTP, binary tensors); medians are printed and written to
bench/results/python-backend-<timestamp>.json with the exact commands.

    python bench/python_backend.py [--repeat 3] [--concurrency 16] [--window-ms 2000]
                                   [--baseline OTHER_CHECKOUT] [--models NAME,...]
                                   [--oceanus-args "--frontend-workers=8 ..."]
                                   [--protocol http|grpc]

Issue 28 adds `identity_dyna_inproc` / `identity_one_inproc` (the same models with Oceanus's
`oceanus_in_process` parameter; Triton ignores parameters it does not know and serves them with
its stub, so their ratio is in-process Oceanus against stub Triton) and `identity_4mib` (one
4 MiB FP32 tensor per request; the one-off shared-memory files Oceanus creates while serving it
are counted with inotify and printed).

`onnx_identity_one` is the ceiling: the same tensors through an ONNX Identity model, which
Oceanus runs on the event loop with no stub and no instance thread, so its rate is what
Oceanus' HTTP frontend and core serve when the model costs nothing. The reference Triton here
has only the Python backend, so Oceanus alone serves it and the table compares it with Triton's
`identity_one`: how far any Python-model path could go on this machine.

`--protocol grpc` drives both servers over gRPC instead (perf_analyzer `-i grpc`).

The reference Triton comes from ../shared/triton-reference/start.sh (the nvidia-pytriton wheel;
its first use creates a venv, a few minutes). Without it only Oceanus is measured.
`--baseline` also serves the same models with the Oceanus of another checkout (an earlier commit,
say), in the same rounds: before/after ratios measured side by side.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import benchlib
import perf

from oceanus.ipc.rings import shm_dir
from oceanus.ipc.shm_watch import ShmWatch

# The reference Triton's launcher beside the checkout (../shared/triton-reference/start.sh).
START_REFERENCE = Path(
    os.environ.get(
        "TRITON_REFERENCE",
        Path(__file__).resolve().parents[2] / "shared" / "triton-reference" / "start.sh",
    )
)
MODEL_PY = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0")
                                 .as_numpy())]
            )
            for r in requests
        ]
"""
CONFIG = """name: "{name}"
backend: "python"
max_batch_size: {max_batch}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {dims} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {dims} ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{batching}
{parameters}"""
IN_PROCESS = 'parameters { key: "oceanus_in_process" value { string_value: "true" } }\n'

CEILING = "onnx_identity_one"  # Oceanus only: no Python in the model's path
DYNA = {"max_batch": 16, "dims": "16", "batching": "dynamic_batching { }"}
ONE = {"max_batch": 0, "dims": "1, 16", "batching": ""}
MODELS = {
    "identity_dyna": {**DYNA, "parameters": ""},
    "identity_one": {**ONE, "parameters": ""},
    "identity_dyna_inproc": {**DYNA, "parameters": IN_PROCESS},
    "identity_one_inproc": {**ONE, "parameters": IN_PROCESS},
    "identity_4mib": {"max_batch": 0, "dims": "1, 1048576", "batching": "", "parameters": ""},
    CEILING: {**ONE, "parameters": ""},
}
SERVERS = ("oceanus", "triton")
CEILING_TWIN = "identity_one"  # the Triton row the ceiling is compared with
BASELINE = "baseline"  # --baseline: the Oceanus of another checkout


def write_repository(root: Path, models: list[str]) -> Path:
    for name in models:
        fields = MODELS[name]
        folder = root / name
        (folder / "1").mkdir(parents=True)
        config = CONFIG.format(name=name, **fields)
        if name == CEILING:
            onnx_identity(folder / "1" / "model.onnx")
            config = config.replace('backend: "python"', 'platform: "onnxruntime_onnx"')
        else:
            (folder / "1" / "model.py").write_text(MODEL_PY)
        (folder / "config.pbtxt").write_text(config)
    return root


def onnx_identity(path: Path) -> None:
    """An ONNX Identity INPUT0 -> OUTPUT0, FP32 [1, 16], as the model.py's tensors."""
    from onnx import TensorProto, helper

    from oceanus.examples._graph import make_model

    shape = [1, 16]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        "identity",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, shape)],
    )
    path.write_bytes(make_model(graph).SerializeToString())


def start(
    server: str, repository: Path, baseline: Path | None = None, extra: Sequence[str] = ()
) -> tuple[subprocess.Popen[bytes] | None, int, int, int]:
    """(process or None for the reference, whose pid is killed by stop), http port, grpc port,
    pid."""
    http, grpc_port, metrics = (benchlib.free_port() for _ in range(3))
    if server in ("oceanus", BASELINE):
        checkout = baseline if server == BASELINE and baseline is not None else benchlib.ROOT
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "oceanus",
                f"--model-repository={repository}",
                f"--http-port={http}",
                f"--grpc-port={grpc_port}",
                "--allow-metrics=false",
                "--http-address=127.0.0.1",
                "--grpc-address=127.0.0.1",
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=dict(os.environ, PYTHONPATH=str(checkout)),
            # `python -m` puts the working directory before PYTHONPATH, for the server and for
            # the stubs it starts: run from the checkout measured, or a baseline started from
            # another checkout's root would run that checkout's code.
            cwd=checkout,
        )
        benchlib.wait_http_ok(f"http://127.0.0.1:{http}/v2/health/ready", process, 120)
        return process, http, grpc_port, process.pid
    out = subprocess.run(
        ["bash", str(START_REFERENCE), str(repository), str(http), str(grpc_port), str(metrics)],
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
        # Not this checkout: Triton's stub would import Oceanus' triton_python_backend_utils.py
        # from the working directory instead of its own.
        cwd=repository,
    )
    pid = int(out.stdout.strip().splitlines()[-1])
    benchlib.wait_http_ok(f"http://127.0.0.1:{http}/v2/health/ready", None, 120)
    return None, http, grpc_port, pid


def process_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) of a server process and of its children together (the
    Python stubs: Oceanus' and Triton's are children of the server process)."""
    cpu = benchlib.cpu_seconds
    return cpu(pid), sum(cpu(c) for c in benchlib.child_pids(pid))


def cpu_per_request(
    before: tuple[float, float, int], after: tuple[float, float, int]
) -> dict[str, float]:
    """CPU-µs per request of the server process and of its stubs between two readings of
    (server CPU s, stub CPU s, inference count)."""
    count = after[2] - before[2]
    if count <= 0:
        return {}
    return {
        "server_cpu_us": round((after[0] - before[0]) * 1e6 / count, 1),
        "stub_cpu_us": round((after[1] - before[1]) * 1e6 / count, 1),
    }


def cpu_cell(medians: dict[str, float]) -> str:
    """ "server + stub" CPU-µs per request, for the table."""
    return f"{medians.get('server_cpu_us', 0):.0f} + {medians.get('stub_cpu_us', 0):.0f}"


def stop(process: subprocess.Popen[bytes] | None, pid: int) -> None:
    if process is not None:
        benchlib.stop_process(process)
        return
    subprocess.run(["kill", str(pid)], check=False)
    for _ in range(100):
        if subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode != 0:
            return
        time.sleep(0.1)
    subprocess.run(["kill", "-9", str(pid)], check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--window-ms", type=int, default=2000)
    parser.add_argument("--baseline", type=Path, help="another checkout to serve beside this one")
    parser.add_argument(
        "--oceanus-args",
        default="",
        help="extra flags for both Oceanus servers, space-separated (e.g. --frontend-workers=8)",
    )
    parser.add_argument(
        "--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}"
    )
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http")
    args = parser.parse_args()
    models = [m for m in args.models.split(",") if m]
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        parser.error(f"unknown models: {', '.join(unknown)}")
    found = perf.find_perf_analyzer()
    if found is None:
        print(f"perf_analyzer not found: run {perf.INSTALL_HINT}")
        return 1
    binary, env = found
    servers = SERVERS if START_REFERENCE.exists() else ("oceanus",)
    if args.baseline is not None:
        servers = (servers[0], BASELINE, *servers[1:])
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {s: {m: [] for m in models} for s in servers}
    one_off: dict[str, dict[str, int]] = {s: {m: 0 for m in models} for s in servers}
    load_before = benchlib.loadavg()
    with tempfile.TemporaryDirectory(prefix="oceanus-pybench-") as tmp:
        repository = write_repository(Path(tmp) / "oceanus", models)
        # The reference would refuse to start on the ONNX ceiling (its build has no ORT).
        reference_repository = write_repository(
            Path(tmp) / "triton", [m for m in models if m != CEILING]
        )
        for round_index in range(args.repeat):
            order = servers if round_index % 2 == 0 else tuple(reversed(servers))
            for server in order:
                served = reference_repository if server == "triton" else repository
                process, port, grpc_port, pid = start(
                    server, served, args.baseline, args.oceanus_args.split()
                )
                load_port = grpc_port if args.protocol == "grpc" else port
                try:
                    for model in models:
                        if model == CEILING and server == "triton":
                            continue  # the reference serves Python models only
                        watch = ShmWatch(shm_dir()) if server != "triton" else None
                        url = f"127.0.0.1:{port}"
                        count = benchlib.model_stats(url, model)["inference_count"]
                        before = (*process_cpu(pid), count)
                        result = perf.run_level(
                            binary,
                            env,
                            model,
                            f"127.0.0.1:{load_port}",
                            args.concurrency,
                            protocol=args.protocol,
                            window_ms=args.window_ms,
                        )
                        count = benchlib.model_stats(url, model)["inference_count"]
                        result.update(cpu_per_request(before, (*process_cpu(pid), count)))
                        if watch is not None:
                            prefix = f"oceanus-py-{pid}-"
                            files = sum(n.startswith(prefix) for n in watch.created())
                            watch.close()
                            one_off[server][model] += files
                            result["one_off_files"] = files
                        runs[server][model].append(result)
                        print(
                            f"round {round_index + 1} {server:8s} {model:14s} "
                            f"{result.get('throughput', 0):7.0f} infer/s  "
                            f"p50 {result.get('p50_ms') or 0:.2f} ms  CPU-µs/request: server "
                            f"{result.get('server_cpu_us', 0):.0f}, stub "
                            f"{result.get('stub_cpu_us', 0):.0f}"
                        )
                finally:
                    stop(process, pid)
    medians = {
        server: {
            model: {
                "infer_per_s": benchlib.median([r.get("throughput", 0.0) for r in results]),
                "p50_ms": benchlib.median([r.get("p50_ms") or 0.0 for r in results]),
                **{
                    key: benchlib.median([r.get(key, 0.0) for r in results])
                    for key in ("server_cpu_us", "stub_cpu_us")
                },
            }
            for model, results in per_model.items()
            if results
        }
        for server, per_model in runs.items()
    }
    others = [server for server in servers if server != "oceanus"]
    rows = []
    for model in models:
        ours = medians["oceanus"][model]
        row = [model, f"{ours['infer_per_s']:.0f}", f"{ours['p50_ms']:.2f}", cpu_cell(ours)]
        for server in others:
            twin = CEILING_TWIN if model == CEILING and server == "triton" else model
            theirs = medians[server].get(twin, {"infer_per_s": 0.0, "p50_ms": 0.0})
            ratio = ours["infer_per_s"] / theirs["infer_per_s"] if theirs["infer_per_s"] else 0
            row += [f"{theirs['infer_per_s']:.0f}", f"{theirs['p50_ms']:.2f}", cpu_cell(theirs)]
            row.append(f"{ratio:.2f}x")
        rows.append(row)
    headers = ["model", "Oceanus infer/s", "p50 ms", "CPU-µs/req"]
    for server in others:
        label = "Triton" if server == "triton" else "baseline"
        headers += [f"{label} infer/s", "p50 ms", "CPU-µs/req", f"vs {label}"]
    print()
    print(benchlib.table(headers, rows))
    print(
        f"{args.protocol}, concurrency {args.concurrency}, medians of {args.repeat}; "
        f"load before {load_before}"
    )
    print("CPU-µs/req: the server process + its stub processes, per request, over the run")
    print(f"one-off shared-memory files Oceanus created, all rounds: {one_off['oceanus']}")
    if CEILING in models and "triton" in servers:
        print(f"{CEILING}: Oceanus only (ONNX, no Python); its Triton column is {CEILING_TWIN}'s")
    benchlib.write_side_by_side(
        "python-backend", args, load_before, medians=medians, runs=runs, one_off_files=one_off
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
