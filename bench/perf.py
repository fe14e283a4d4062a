"""Run NVIDIA perf_analyzer once per concurrency level and parse its ``-f`` CSV and stdout.

perf_analyzer lives in the venv scripts/install_perf_analyzer.sh makes (``PA_VENV``, default
``${OCEANUS_CACHE_DIR:-~/.cache/oceanus}/perf_analyzer``); it needs libcudart from that venv on
LD_LIBRARY_PATH, which scripts/perf_analyzer.sh sets. We call the binary directly with the same
environment so the exact command line can be logged.
"""

from __future__ import annotations

import csv
import os
import re
import shlex
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

INSTALL_HINT = "bash scripts/install_perf_analyzer.sh"


def pa_venv() -> Path:
    """The rule of scripts/install_perf_analyzer.sh and scripts/perf_analyzer.sh."""
    if os.environ.get("PA_VENV"):
        return Path(os.environ["PA_VENV"])
    cache = os.environ.get("OCEANUS_CACHE_DIR") or str(Path.home() / ".cache" / "oceanus")
    return Path(cache) / "perf_analyzer"


def find_perf_analyzer() -> tuple[Path, dict[str, str]] | None:
    """(binary, environment) or None when perf_analyzer is not installed."""
    venv = pa_venv()
    binary = venv / "bin" / "perf_analyzer"
    if not os.access(binary, os.X_OK):
        return None
    libdirs = sorted(venv.glob("lib/python3*/site-packages/nvidia/cuda_runtime/lib"))
    if not libdirs:
        return None
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = str(libdirs[0]) + (
        ":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else ""
    )
    try:
        probe = subprocess.run(
            [str(binary), "--version"], env=env, capture_output=True, timeout=20, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (probe.stdout + probe.stderr).decode(errors="replace")
    if "error while loading shared libraries" in text:
        return None
    return binary, env


def _int(value: str) -> int | None:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def _ms(usec: str | None) -> float | None:
    value = _int(usec or "")
    return value / 1000 if value is not None else None


_PASS = re.compile(r"Pass \[(\d+)\] throughput: ([\d.]+) infer/sec\. Avg latency: (\d+) usec")
_SERVER_COUNTS = re.compile(
    r"Server:\s*\n\s*Inference count:\s*(\d+)\s*\n\s*Execution count:\s*(\d+)", re.M
)


def parse_output(csv_path: Path, stdout: str) -> dict[str, Any]:
    """The single CSV row perf_analyzer wrote (one concurrency level) plus stdout counts."""
    with csv_path.open(newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r.get("Concurrency", "").strip()]
    if not rows:
        raise ValueError(f"no rows in {csv_path}")
    row = rows[0]
    out: dict[str, Any] = {
        "throughput": float(row["Inferences/Second"]),
        "p50_ms": _ms(row.get("p50 latency")),
        "p90_ms": _ms(row.get("p90 latency")),
        "p95_ms": _ms(row.get("p95 latency")),
        "p99_ms": _ms(row.get("p99 latency")),
        "avg_ms": _ms(row.get("Avg latency")),
        # Server-side columns: perf_analyzer computes them from /v2/models/<m>/stats deltas.
        "server_us": {
            key: _int(row[col])
            for key, col in (
                ("queue", "Server Queue"),
                ("compute_input", "Server Compute Input"),
                ("compute_infer", "Server Compute Infer"),
                ("compute_output", "Server Compute Output"),
                ("network_and_server_send_recv", "Network+Server Send/Recv"),
            )
            if col in row
        },
        "csv_row": row,
    }
    passes = [(float(m.group(2)), int(m.group(3)) / 1000) for m in _PASS.finditer(stdout)]
    if passes:
        # Every measurement window (-v): perf_analyzer reports the last 3 merged.
        out["passes"] = [{"throughput": t, "avg_ms": a} for t, a in passes]
        last = [t for t, _ in passes[-3:]]
        out["spread"] = max(last) / min(last) if min(last) > 0 else None
    match = _SERVER_COUNTS.search(stdout)
    if match:
        inferences, executions = int(match.group(1)), int(match.group(2))
        out["pa_server_inference_count"] = inferences
        out["pa_server_execution_count"] = executions
        out["pa_mean_batch"] = inferences / executions if executions else None
    return out


def command(
    binary: Path | str,
    model: str,
    url: str,
    concurrency: int,
    *,
    protocol: str = "http",
    window_ms: int = 3000,
    stability: int = 50,
    max_trials: int = 3,
    input_data: Path | None = None,
    csv_path: Path | str = "pa.csv",
    extra: list[str] | None = None,
) -> list[str]:
    argv = [
        str(binary),
        "-m",
        model,
        "-u",
        url,
        "-i",
        protocol,
        # C:C, not C: with an explicit end perf_analyzer's sync mode starts one thread per
        # concurrent request whatever --max-threads (default 16) says.
        "--concurrency-range",
        f"{concurrency}:{concurrency}",
        "--measurement-interval",
        str(window_ms),
        "-s",
        str(stability),
        "--max-trials",
        str(max_trials),
        "-f",
        str(csv_path),
        "--verbose-csv",
        "-v",
    ]
    if input_data is not None:
        argv += ["--input-data", str(input_data)]
    return argv + list(extra or [])


RELAXED = 1000  # -s: any 3 windows count as stable


def run_level(
    binary: Path,
    env: dict[str, str],
    model: str,
    url: str,
    concurrency: int,
    *,
    protocol: str = "http",
    window_ms: int = 3000,
    stability: int = RELAXED,
    max_trials: int = 3,
    input_data: Path | None = None,
    timeout: float | None = None,
    extra: list[str] | None = None,
) -> dict[str, Any]:
    """One perf_analyzer run at one concurrency.

    With the default ``stability=RELAXED`` perf_analyzer measures exactly 3 windows and reports
    them merged; their spread (max/min throughput) is kept as ``spread``. With a real threshold
    (e.g. 10-50) an unstable level (exit 2) is rerun once relaxed and marked ``stable: False``."""
    attempts: list[dict[str, Any]] = []
    for relaxed in (False, True) if stability < RELAXED else (True,):
        with tempfile.TemporaryDirectory(prefix="oceanus-pa-") as tmp:
            csv_path = Path(tmp) / "pa.csv"
            s = RELAXED if relaxed else stability
            trials = 3 if relaxed else max_trials
            argv = command(
                binary,
                model,
                url,
                concurrency,
                protocol=protocol,
                window_ms=window_ms,
                stability=s,
                max_trials=trials,
                input_data=input_data,
                csv_path=csv_path,
                extra=extra,
            )
            limit = timeout or (trials * window_ms / 1000 * 4 + 60)
            started = time.perf_counter()
            try:
                proc = subprocess.run(
                    argv, env=env, capture_output=True, timeout=limit, check=False
                )
                rc: int | str = proc.returncode
                stdout = proc.stdout.decode(errors="replace")
                stderr = proc.stderr.decode(errors="replace")
            except subprocess.TimeoutExpired as err:
                rc = "timeout"
                stdout = (err.stdout or b"").decode(errors="replace")
                stderr = (err.stderr or b"").decode(errors="replace")
            wall = time.perf_counter() - started
            attempt: dict[str, Any] = {
                "command": shlex.join(["perf_analyzer", *argv[1:]]).replace(
                    str(csv_path), "pa.csv"
                ),
                "rc": rc,
                "wall_s": round(wall, 1),
            }
            if rc == 0 and csv_path.exists():
                attempt.update(parse_output(csv_path, stdout))
                attempt["stable"] = not relaxed if stability < RELAXED else None
                attempts.append(attempt)
                break
            attempt["error"] = _error_text(stdout + "\n" + stderr)
            attempts.append(attempt)
            if rc != 2:  # not an instability: a real failure, do not retry
                break
    result = dict(attempts[-1])
    result["attempts"] = [
        {k: a[k] for k in ("command", "rc", "wall_s", "error") if k in a} for a in attempts
    ]
    return result


def _error_text(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    interesting = [ln for ln in lines if re.search(r"error|fail|unable|unstable", ln, re.I)]
    return "\n".join((interesting or lines)[-6:])[:2000]


def main() -> int:
    """``python bench/perf.py --url 127.0.0.1:8000 [--model simple_dyna] [-i grpc]``: one
    perf_analyzer run, then check that its server-side columns were filled (they come from
    /v2 (extensions must list ``statistics``) and /v2/models/<m>/stats)."""
    import argparse
    import json

    parser = argparse.ArgumentParser(
        description=main.__doc__.splitlines()[0] if main.__doc__ else None
    )
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", default="simple_dyna")
    parser.add_argument("-i", "--protocol", choices=("http", "grpc"), default="http")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--window-ms", type=int, default=2000)
    parser.add_argument(
        "--write-input-data",
        type=Path,
        metavar="JSON",
        help="only write a valid --input-data file for --model and exit",
    )
    args = parser.parse_args()
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import benchlib

    model = benchlib.load_model_info(benchlib.example_repository([args.model]), args.model)
    if args.write_input_data:
        written = benchlib.perf_analyzer_input_file(model, args.write_input_data)
        print(written or f"{args.model}: random data is valid, no file needed")
        return 0
    found = find_perf_analyzer()
    if found is None:
        print(f"perf_analyzer not found under {pa_venv()}; run {INSTALL_HINT}")
        return 127
    with tempfile.TemporaryDirectory() as tmp:
        data = benchlib.perf_analyzer_input_file(model, Path(tmp) / "data.json")
        row = run_level(
            found[0],
            found[1],
            args.model,
            args.url,
            args.concurrency,
            protocol=args.protocol,
            window_ms=args.window_ms,
            input_data=data,
        )
    row.pop("csv_row", None)
    print(json.dumps(row, indent=2))
    server = row.get("server_us", {})
    problems = []
    if row.get("throughput") is None:
        problems.append("perf_analyzer failed")
    if not server or not server.get("compute_infer"):
        problems.append("server-side columns empty: Server Compute Infer is 0 or missing")
    if not row.get("pa_server_inference_count"):
        problems.append("perf_analyzer printed no server Inference count (stats not read)")
    for problem in problems:
        print(f"PROBLEM: {problem}")
    if not problems:
        print(
            f"OK: server-side columns filled (queue {server.get('queue')} us, compute infer "
            f"{server.get('compute_infer')} us, mean batch {row.get('pa_mean_batch'):.2f})"
        )
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
