"""Oceanus benchmark (issue #3): in-process limit vs Oceanus under load vs a naive FastAPI server.

    python bench/run.py [--quick] [--models resnet50_onnx,text_classifier_onnx,simple,simple_dyna]
                        [--skip latency,naive,...] [--repeat N]
    python bench/run.py --models resnet_small_pytorch,resnet50_openvino   # PyTorch / OpenVINO

Phases, per model, measured side by side (one model's three phases run back to back, so machine
noise hits them alike):

1. in-process throughput of the model's own framework (ONNX Runtime, TorchScript under
   torch.inference_mode, OpenVINO's compiled model) at batch 1, 8, 16, 32, 64 (<= max_batch_size),
   with the backend's settings and with the framework's defaults (bench/inproc.py);
2. Oceanus under N concurrent single-sample clients, HTTP + binary tensors, driven by
   perf_analyzer (bench/perf.py) or, without it, bench/loadgen.py; mean executed batch size from
   /v2/models/<m>/stats deltas;
3. bench/naive_server.py (FastAPI, JSON, one request at a time) under bench/loadgen.py (ONNX
   models only);

then single-request latency and start-up time (bench/latency.py), ratios and the issue's
targets. Prints tables; writes bench/results/<timestamp>.json (and server logs next to it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib
import inproc
import latency
import loadgen
import perf
from run_report import HTTP_SHM, SAME_FILE, TARGET_MODELS, print_report, summarize

ALL_MODELS = ["simple", "simple_dyna", "text_classifier_onnx", "resnet50_onnx"]
# The PyTorch and OpenVINO example models (oceanus/examples): run when named in --models (their
# frameworks are optional; the default run stays the ONNX models).
FRAMEWORK_MODELS = [
    "simple_pytorch",
    "resnet_small_pytorch",
    "resnet50_pytorch",
    "simple_openvino",
    "resnet50_openvino",
]
KNOWN_MODELS = ALL_MODELS + FRAMEWORK_MODELS
NAIVE_MODELS = {"resnet50_onnx", "text_classifier_onnx", "simple"}
PHASES = ("inproc", "oceanus", "naive", "grpc", "shm", "latency", "startup")
# The gRPC points (model -> concurrency): issue 4's targets.
GRPC_LEVELS = {"simple": 16, "resnet50_onnx": 32}
# HTTP with perf_analyzer's inputs and outputs in system shared memory (no tensor bytes on the
# socket): the point where moving 602 KB per request costs as much CPU as the model's compute.
SHM_LEVELS = {"resnet_small_pytorch": 32}
SHM_ARGS = ["--shared-memory=system", "--output-shared-memory-size=65536"]


def plan(model: str, quick: bool) -> dict[str, Any]:
    """Batch sizes, concurrency levels and window lengths per model (full / --quick)."""
    small = model in ("simple", "simple_dyna", "simple_pytorch", "simple_openvino")
    resnet = model in ("resnet50_onnx", "resnet50_pytorch", "resnet50_openvino")
    framework = model in FRAMEWORK_MODELS and not small
    if quick:
        return {
            # ResNet-50 is compute-bound at any batch size on CPU: two points are enough (the
            # PyTorch/OpenVINO models: 1, 8, 16, 32 as issue 8 asks; slow points are skipped).
            "batches": [1, 8, 16, 32] if framework else [1, 8] if resnet or small else [1, 8, 16],
            "inproc_s": 1.5 if resnet else 1.0,
            "levels": [1, 16] if small else [1, 32],
            "pa_window_ms": 2500 if resnet else (2000 if not small else 1500),
            "naive_levels": [16] if small else [32],
            "naive_window_s": 5.0 if resnet else (3.0 if not small else 2.0),
            "naive_warmup_s": 2.0 if resnet else 1.0,
            "naive_max_warmup_s": 10.0,
        }
    return {
        "batches": [1, 8, 16, 32] if framework else [1, 8, 16, 32, 64],
        "inproc_s": 3.0 if resnet else 2.0,
        "levels": [1, 8, 16, 32, 64] if small else [1, 8, 32, 64],
        "pa_window_ms": 4000 if resnet else (3000 if not small else 2000),
        "naive_levels": [1, 8, 16, 32, 64] if small else [1, 8, 32, 64],
        "naive_window_s": 8.0 if resnet else (5.0 if not small else 3.0),
        "naive_warmup_s": 2.0 if resnet else 1.0,
        "naive_max_warmup_s": 20.0,
    }


class Log:
    def __init__(self) -> None:
        self.started = time.perf_counter()

    def __call__(self, message: str) -> None:
        print(f"[{time.perf_counter() - self.started:6.1f}s] {message}", flush=True)


def window_for(level: int, base_ms: int, cap_ms: int, expected_per_s: float | None) -> int:
    """A window long enough for every client to get about one answer (closed loop: a cycle takes
    level / throughput seconds), so that the windows are not all ramp-up on a slow machine."""
    if not expected_per_s:
        return base_ms
    return int(min(cap_ms, max(base_ms, 1000 * level / expected_per_s)))


def oceanus_levels(
    server: benchlib.Server,
    model: benchlib.ModelInfo,
    levels: list[int],
    window_ms: int,
    pa: tuple[Path, dict[str, str]] | None,
    work_dir: Path,
    log: Log,
    protocol: str = "http",
    stability: int = perf.RELAXED,
    expected_per_s: float | None = None,
    window_cap_ms: int = 12000,
) -> list[dict[str, Any]]:
    """`protocol`: "http", "grpc", or HTTP_SHM (HTTP, tensors in system shared memory)."""
    rows = []
    input_file = benchlib.perf_analyzer_input_file(model, work_dir / f"{model.name}-pa-data.json")
    url_bodies = None
    for level in levels:
        before = benchlib.model_stats(server.http_url, model.name)
        if pa is not None:
            url = server.grpc_url if protocol == "grpc" else server.http_url
            assert url is not None
            row = perf.run_level(
                pa[0],
                pa[1],
                model.name,
                url,
                level,
                protocol="grpc" if protocol == "grpc" else "http",
                window_ms=window_for(level, window_ms, window_cap_ms, expected_per_s),
                stability=stability,
                input_data=input_file,
                extra=SHM_ARGS if protocol == HTTP_SHM else None,
            )
            row["loadgen"] = "perf_analyzer"
        else:
            if url_bodies is None:
                url_bodies = loadgen.build_requests(model, "kserve", f"http://{server.http_url}")
            seconds = max(2.0, 3 * window_ms / 1000)
            row = loadgen.run_level(url_bodies[0], url_bodies[1], level, seconds, warmup=1.0)
            row["loadgen"] = "bench/loadgen.py (kserve binary)"
        after = benchlib.model_stats(server.http_url, model.name)
        inferences = after["inference_count"] - before["inference_count"]
        executions = after["execution_count"] - before["execution_count"]
        row.update(
            model=model.name,
            concurrency=level,
            protocol=protocol,
            stats_inference_count=inferences,
            stats_execution_count=executions,
            mean_batch=inferences / executions if executions else None,
        )
        rows.append(row)
        if row.get("throughput") is not None:
            log(
                f"  oceanus {protocol} {model.name} c={level}: {row['throughput']:.1f} infer/s, "
                f"p50 {benchlib.fmt_num(row.get('p50_ms'))} ms, p99 "
                f"{benchlib.fmt_num(row.get('p99_ms'))} ms, mean batch "
                f"{benchlib.fmt_num(row['mean_batch'], 2)}, window spread x"
                f"{benchlib.fmt_num(row.get('spread'), 2)}"
                + (" (unstable: -s relaxed)" if row.get("stable") is False else "")
            )
        else:
            log(
                f"  oceanus {protocol} {model.name} c={level}: FAILED rc={row.get('rc')}: "
                f"{row.get('error', '')[:400]}"
            )
    return rows


def naive_levels(
    model: benchlib.ModelInfo, plan_: dict[str, Any], log_dir: Path, mode: str, log: Log
) -> list[dict[str, Any]]:
    """bench/loadgen.py (JSON) against bench/naive_server.py, level by level. Requests still in
    flight after a level's window are awaited briefly; if some remain (a deep single queue), the
    naive server is restarted so the next level starts from an idle server."""
    rows = []
    levels = list(plan_["naive_levels"])
    window = plan_["naive_window_s"]
    while levels:
        with benchlib.naive_server(model.path, log_dir, mode=mode) as server:
            url, bodies = loadgen.build_requests(model, "json", f"http://{server.http_url}")
            while levels:
                level = levels.pop(0)
                row = loadgen.run_level(
                    url,
                    bodies,
                    level,
                    window,
                    plan_["naive_warmup_s"],
                    drain_timeout=5.0 if levels else 0.0,
                    max_warmup=plan_["naive_max_warmup_s"],
                    min_completions=min(level, 16),
                    max_window=3 * window,
                )
                row.update(model=model.name, mode=mode, body_bytes=len(bodies[0][0]))
                rows.append(row)
                log(
                    f"  naive {model.name} c={level}: {row['throughput']:.1f} req/s, p50 "
                    f"{benchlib.fmt_num(row['p50_ms'])} ms, p99 "
                    f"{benchlib.fmt_num(row['p99_ms'])} ms ({row['completed']} in "
                    f"{row['window_s']:.1f} s after {row['warmup_s']:.1f} s warm-up"
                    + (", warm-up capped" if row["warmup_capped"] else "")
                    + ")"
                    + (
                        f", {row['errors']} errors: {row['first_errors'][:1]}"
                        if row["errors"]
                        else ""
                    )
                )
                if row["undrained"] and levels:
                    break  # restart the server: its queue still holds abandoned requests
    return rows


def meta(args: argparse.Namespace, pa: tuple[Path, dict[str, str]] | None) -> dict[str, Any]:
    def git(*cmd: str) -> str:
        try:
            return subprocess.run(
                ["git", *cmd],
                cwd=benchlib.ROOT,
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            ).stdout.strip()
        except OSError:
            return ""

    pa_version = ""
    if pa is not None:
        probe = subprocess.run(
            [str(pa[0]), "--version"],
            env=pa[1],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        lines = (probe.stdout + probe.stderr).strip().splitlines()
        pa_version = lines[-1] if lines else ""
    return {
        "argv": sys.argv,
        "quick": args.quick,
        "repeat": args.repeat,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        **inproc.framework_versions(),
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty_files": len(git("status", "--porcelain").splitlines()),
        "perf_analyzer": str(pa[0]) if pa else None,
        "perf_analyzer_version": pa_version,
        "oceanus_loadgen": "perf_analyzer" if pa else "bench/loadgen.py (kserve binary)",
        "loadavg_start": benchlib.loadavg(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer points, shorter windows")
    parser.add_argument("--models", default=",".join(ALL_MODELS))
    parser.add_argument("--skip", default="", help=f"comma-separated phases from {PHASES}")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="repeat the per-model phases N times; tables show medians",
    )
    parser.add_argument("--naive-mode", choices=("executor", "lock"), default="executor")
    parser.add_argument(
        "--loadgen",
        choices=("auto", "python"),
        default="auto",
        help="auto: perf_analyzer if installed, else bench/loadgen.py",
    )
    parser.add_argument(
        "--stability",
        type=int,
        default=perf.RELAXED,
        help="perf_analyzer -s; default 1000: exactly 3 windows, their spread "
        "reported; below 1000 unstable levels are rerun once with -s 1000",
    )
    parser.add_argument("--output", type=Path, help="JSON path (default bench/results/<ts>.json)")
    args = parser.parse_args()

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = set(models) - set(KNOWN_MODELS)
    if unknown:
        parser.error(f"unknown models {sorted(unknown)}; choose from {KNOWN_MODELS}")
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if skip - set(PHASES):
        parser.error(f"unknown phases {sorted(skip - set(PHASES))}; choose from {PHASES}")

    log = Log()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_path = args.output or benchlib.RESULTS_DIR / f"{stamp}.json"
    work_dir = benchlib.RESULTS_DIR / f"{stamp}-logs"
    work_dir.mkdir(parents=True, exist_ok=True)

    pa = perf.find_perf_analyzer() if args.loadgen == "auto" else None
    if pa is None and args.loadgen == "auto":
        log(
            f"perf_analyzer not found in {perf.pa_venv()} ({perf.INSTALL_HINT}): "
            "using bench/loadgen.py for Oceanus"
        )
    results: dict[str, Any] = {
        "meta": meta(args, pa),
        "plan": {},
        "inproc": [],
        "inproc_recheck": [],
        "oceanus": [],
        "naive": [],
        "problems": [],
    }

    def save() -> None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(results, indent=2, default=str))

    log("preparing the example repository")
    repository = benchlib.example_repository(models)
    infos = {m: benchlib.load_model_info(repository, m) for m in models}
    results["meta"]["repository"] = str(repository)

    if {"oceanus", "inproc", "naive", "grpc"} - skip:
        with contextlib.ExitStack() as stack:
            server = None
            if {"oceanus", "grpc"} - skip:
                log(f"starting Oceanus on {repository}")
                server = stack.enter_context(benchlib.oceanus_server(repository, work_dir))
                results["meta"]["oceanus_command"] = " ".join(["python", *server.argv[1:]])
                results["meta"]["oceanus_ready_s"] = round(server.ready_s, 2)
                results["meta"]["oceanus_log"] = str(server.log_path)
            for rep in range(args.repeat):
                for name in models:
                    model = infos[name]
                    p = plan(name, args.quick)
                    results["plan"][name] = p
                    log(f"== {name} (repeat {rep + 1}/{args.repeat})")
                    best = None  # (samples/s, options, batch) of this repeat's sweep
                    if "inproc" not in skip and name not in SAME_FILE:
                        batches = [b for b in p["batches"] if b <= max(1, model.max_batch_size)]
                        for row in inproc.throughput(model, batches, p["inproc_s"], log=log):
                            results["inproc"].append(dict(row, repeat=rep))
                            if "samples_per_s" in row and (
                                best is None or row["samples_per_s"] > best[0]
                            ):
                                best = (row["samples_per_s"], row["options"], row["batch"])
                    if server is not None and "oceanus" not in skip:
                        for row in oceanus_levels(
                            server,
                            model,
                            p["levels"],
                            p["pa_window_ms"],
                            pa,
                            work_dir,
                            log,
                            stability=args.stability,
                            expected_per_s=best and best[0],
                            window_cap_ms=8000 if args.quick else 12000,
                        ):
                            results["oceanus"].append(dict(row, repeat=rep))
                            if row.get("throughput") is None:
                                results["problems"].append(
                                    f"oceanus {name} c={row['concurrency']}: {row.get('error')}"
                                )
                        if best is not None and name in TARGET_MODELS:
                            # Bracket the Oceanus levels: the best in-process point once more.
                            log("  in-process recheck of the best point, after the server load:")
                            for row in inproc.throughput(
                                model, [best[2]], p["inproc_s"], option_sets=(best[1],), log=log
                            ):
                                results["inproc_recheck"].append(dict(row, repeat=rep))
                    # One point each over gRPC and over HTTP with shared memory, where planned.
                    for phase, levels, protocol in (
                        ("grpc", GRPC_LEVELS, "grpc"),
                        ("shm", SHM_LEVELS, HTTP_SHM),
                    ):
                        if server is None or phase in skip or pa is None or name not in levels:
                            continue
                        for row in oceanus_levels(
                            server,
                            model,
                            [levels[name]],
                            p["pa_window_ms"],
                            pa,
                            work_dir,
                            log,
                            protocol=protocol,
                            stability=args.stability,
                        ):
                            results["oceanus"].append(dict(row, repeat=rep))
                    if "naive" not in skip and name in NAIVE_MODELS:
                        try:
                            for row in naive_levels(model, p, work_dir, args.naive_mode, log):
                                results["naive"].append(dict(row, repeat=rep))
                        except Exception as err:  # keep the rest of the run
                            results["problems"].append(f"naive {name}: {err}")
                            log(f"  naive {name} FAILED: {err}")
                    save()
            if server is not None and server.proc.poll() is not None:
                results["problems"].append(f"oceanus exited early: {server.proc.returncode}")

    if "latency" not in skip:
        log("== latency")
        lat_models = [m for m in ("simple", "resnet50_onnx") if m in models] or ["simple"]
        results["latency"] = latency.run(
            args.quick, work_dir, lat_models, startup="startup" not in skip, log=log
        )

    results["meta"]["loadavg_end"] = benchlib.loadavg()
    results["meta"]["wall_s"] = round(time.perf_counter() - log.started, 1)
    results["summary"] = summarize(results)
    save()
    print_report(results, results["summary"])
    if results["problems"]:
        print("\n== Problems")
        for problem in results["problems"]:
            print(f"- {problem}")
    print(f"\nJSON: {out_path}\nlogs: {work_dir}\nwall: {results['meta']['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
