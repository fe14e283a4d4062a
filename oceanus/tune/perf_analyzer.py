"""NVIDIA's perf_analyzer as the load generator, when it is installed.

It ships inside the `tritonclient` wheel (`pip install tritonclient[all]` puts it in the
environment's bin/) and needs the CUDA runtime library from the `nvidia-cuda-runtime-cu12`
wheel even without a GPU. Found, in order: `--perf-analyzer PATH`, `$PERF_ANALYZER`, `PATH`,
`$PA_VENV/bin/perf_analyzer`. The CUDA runtime is looked for beside it, in the same environment's
site-packages, and put on LD_LIBRARY_PATH.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class PaResult:
    throughput: float  # inferences per second
    p50_us: float
    p90_us: float
    p99_us: float
    avg_us: float


class Unstable(RuntimeError):
    """perf_analyzer could not call its windows stable."""


def find(explicit: str = "") -> Path | None:
    """The perf_analyzer binary, or None."""
    candidates = [explicit, os.environ.get("PERF_ANALYZER", ""), shutil.which("perf_analyzer")]
    venv = os.environ.get("PA_VENV")
    if venv:
        candidates.append(str(Path(venv) / "bin" / "perf_analyzer"))
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def environment(binary: Path) -> dict[str, str]:
    """The environment to run it in: the CUDA runtime of its own Python environment on
    LD_LIBRARY_PATH (where pip's nvidia-cuda-runtime-cu12 puts libcudart.so.12)."""
    env = dict(os.environ)
    prefix = binary.resolve().parent.parent
    found = sorted(prefix.glob("lib/python3*/site-packages/nvidia/cuda_runtime/lib"))
    if found:
        old = env.get("LD_LIBRARY_PATH", "")
        env["LD_LIBRARY_PATH"] = str(found[0]) + (f":{old}" if old else "")
    return env


def version(binary: Path) -> str:
    """Its version line; raises RuntimeError when it cannot run here (a missing library)."""
    try:
        result = subprocess.run(
            [str(binary), "--version"],
            env=environment(binary),
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(str(exc)) from None
    if result.returncode != 0:
        lines = (result.stdout + result.stderr).strip().splitlines()
        raise RuntimeError(lines[-1] if lines else f"exit code {result.returncode}")
    return result.stdout.strip().splitlines()[0] if result.stdout.strip() else "perf_analyzer"


def shape_flags(metadata: dict[str, Any], max_batch_size: int) -> list[str]:
    """`--shape NAME:dims` for inputs with variable dimensions (one element each)."""
    flags = []
    for item in metadata["inputs"]:
        dims = [int(d) for d in item["shape"]]
        if max_batch_size > 0 and dims:
            dims = dims[1:]
        if any(d < 0 for d in dims):
            flags.append(f"--shape={item['name']}:{','.join(str(max(d, 1)) for d in dims)}")
    return flags


def parse_csv(text: str) -> PaResult:
    """perf_analyzer's `-f` file: one row per concurrency; latencies in microseconds."""
    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows:
        raise ValueError("perf_analyzer wrote no measurement")
    row = rows[-1]
    parts = (
        "Client Send",
        "Network+Server Send/Recv",
        "Server Queue",
        "Server Compute Input",
        "Server Compute Infer",
        "Server Compute Output",
        "Client Recv",
    )
    average = sum(float(row.get(part) or 0) for part in parts)
    return PaResult(
        throughput=float(row["Inferences/Second"]),
        p50_us=float(row["p50 latency"]),
        p90_us=float(row["p90 latency"]),
        p99_us=float(row["p99 latency"]),
        avg_us=average,
    )


class PerfAnalyzer:
    def __init__(self, binary: Path, model: str, url: str, flags: list[str]) -> None:
        self.binary = binary
        self.model = model
        self.url = url
        self.flags = flags
        self.env = environment(binary)

    def measure(self, concurrency: int, window_s: float) -> PaResult:
        """One concurrency level: three windows of a third of `window_s` each (at least 250 ms),
        reported as perf_analyzer reports them. It calls a run unstable when a window holds no
        answer (a busy machine can stall that long); such a run is tried once more with windows
        twice as long."""
        interval_ms = max(250, int(window_s * 1000 / 3))
        try:
            return self._run(concurrency, interval_ms)
        except Unstable:
            return self._run(concurrency, 2 * interval_ms)

    def _run(self, concurrency: int, interval_ms: int) -> PaResult:
        with tempfile.TemporaryDirectory(prefix="oceanus-tune-") as folder:
            out = Path(folder) / "pa.csv"
            command = [
                str(self.binary),
                "-m",
                self.model,
                "-u",
                self.url,
                "-i",
                "http",
                f"--concurrency-range={concurrency}:{concurrency}",
                f"--measurement-interval={interval_ms}",
                "--stability-percentage=999",
                "--max-trials=3",
                "-f",
                str(out),
                *self.flags,
            ]
            result = subprocess.run(
                command,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=60 + interval_ms / 100,
            )
            if result.returncode != 0 or not out.exists():
                text = (result.stdout + result.stderr).strip()
                lines = text.splitlines()
                message = f"perf_analyzer exited with {result.returncode}: " + (
                    " | ".join(lines[-3:]) or "no output"
                )
                if "Failed to obtain stable measurement" in text:
                    raise Unstable(message)
                raise RuntimeError(message)
            return parse_csv(out.read_text())
