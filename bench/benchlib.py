"""Shared helpers for the benchmark scripts: ports, server processes, model facts, sample data.

Everything here is plain Python; the scripts in this folder import it as a sibling module
(``python bench/run.py`` puts ``bench/`` on ``sys.path``).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"

# Run from a checkout without installing: make ``import oceanus`` find this tree.
if str(ROOT) not in sys.path:
    sys.path.insert(1, str(ROOT))

# The vocabulary size of oceanus.examples.text_classifier (input ids must stay below it).
TEXT_VOCAB = 8192

NP_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int16)": np.int16,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}
TRITON_DTYPES = {
    np.dtype(np.float32): "FP32",
    np.dtype(np.float64): "FP64",
    np.dtype(np.float16): "FP16",
    np.dtype(np.int64): "INT64",
    np.dtype(np.int32): "INT32",
    np.dtype(np.int16): "INT16",
    np.dtype(np.int8): "INT8",
    np.dtype(np.uint8): "UINT8",
    np.dtype(np.bool_): "BOOL",
}


# ---------------------------------------------------------------------------------------------
# ports and processes


def free_port(low: int = 40000, high: int = 49999) -> int:
    """A TCP port in [low, high] that nothing listens on right now (127.0.0.1)."""
    for _ in range(200):
        port = random.randint(low, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {low}-{high}")


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def wait_http_ok(
    url: str, proc: subprocess.Popen[bytes] | None, timeout: float, interval: float = 0.05
) -> float:
    """Poll *url* until it answers 200; returns the seconds waited. Raises on exit/timeout."""
    start = time.perf_counter()
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} was ready")
        with contextlib.suppress(OSError):
            if http_get(url, timeout=1.0)[0] == 200:
                return time.perf_counter() - start
        if time.perf_counter() - start > timeout:
            raise TimeoutError(f"{url} not ready after {timeout:.0f} s")
        time.sleep(interval)


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """SIGINT (graceful), then SIGKILL; only the process we started, by its pid."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


@dataclass
class Server:
    """A server process we started, with its ports and log file."""

    proc: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int | None
    log_path: Path
    ready_s: float = 0.0
    argv: list[str] = field(default_factory=list)

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str | None:
        return f"127.0.0.1:{self.grpc_port}" if self.grpc_port else None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def oceanus_argv(repository: Path | None, http_port: int, grpc_port: int) -> list[str]:
    argv = [sys.executable, "-m", "oceanus"]
    if repository is not None:
        argv += ["--model-repository", str(repository)]
    argv += [
        "--http-port",
        str(http_port),
        "--grpc-port",
        str(grpc_port),
        "--allow-metrics=false",
        "--http-address",
        "127.0.0.1",
        "--grpc-address",
        "127.0.0.1",
    ]
    return argv


@contextlib.contextmanager
def oceanus_server(
    repository: Path | None,
    log_dir: Path,
    timeout: float = 180.0,
    tag: str = "oceanus",
    extra: Sequence[str] = (),
    wrap: Sequence[str] = (),
    checkout: Path | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[Server]:
    """Start ``python -m oceanus`` on free ports (with `extra` flags; behind `wrap`, a command
    that execs its arguments), wait for /v2/health/ready, stop it afterwards. `checkout`: the
    Oceanus of another checkout (an earlier commit, for a before/after in one run) instead of
    this one; `env`: variables set for it beside this process's."""
    http_port, grpc_port = free_port(), free_port()
    while grpc_port == http_port:
        grpc_port = free_port()
    argv = list(wrap) + oceanus_argv(repository, http_port, grpc_port) + list(extra)
    log_path = log_dir / f"{tag}-{http_port}.log"
    with _started(
        argv, log_path, http_port, grpc_port, "/v2/health/ready", timeout, checkout, env
    ) as server:
        yield server


@contextlib.contextmanager
def naive_server(
    model_path: Path, log_dir: Path, mode: str = "executor", timeout: float = 120.0
) -> Iterator[Server]:
    """Start bench/naive_server.py (FastAPI + uvicorn) for one ONNX file."""
    port = free_port()
    argv = [
        sys.executable,
        str(BENCH_DIR / "naive_server.py"),
        "--model",
        str(model_path),
        "--port",
        str(port),
        "--mode",
        mode,
    ]
    with _started(argv, log_dir / f"naive-{port}.log", port, None, "/health", timeout) as server:
        yield server


@contextlib.contextmanager
def _started(
    argv: list[str],
    log_path: Path,
    http_port: int,
    grpc_port: int | None,
    ready_path: str,
    timeout: float,
    checkout: Path | None = None,
    extra_env: dict[str, str] | None = None,
) -> Iterator[Server]:
    """Run `argv` logging to `log_path` until `ready_path` answers 200; stop it afterwards (its
    log's tail is printed if anything fails meanwhile)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        env = None if checkout is None else dict(os.environ, PYTHONPATH=str(checkout))
        if extra_env:
            env = dict(env or os.environ, **extra_env)
        proc = subprocess.Popen(
            argv, cwd=checkout or ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )
    server = Server(proc, http_port, grpc_port, log_path, argv=argv)
    try:
        server.ready_s = wait_http_ok(f"http://127.0.0.1:{http_port}{ready_path}", proc, timeout)
        yield server
    except Exception:
        tail = server.log_tail()
        if tail:
            print(f"--- {log_path} (tail) ---\n{tail}", file=sys.stderr)
        raise
    finally:
        stop_process(proc)


def model_stats(http_url: str, model: str) -> dict[str, int]:
    """inference_count / execution_count of a model from /v2/models/<m>/stats (all versions)."""
    status, body = http_get(f"http://{http_url}/v2/models/{model}/stats", timeout=10.0)
    if status != 200:
        raise RuntimeError(f"/v2/models/{model}/stats answered {status}: {body[:200]!r}")
    stats = json.loads(body)["model_stats"]
    return {
        "inference_count": sum(int(s.get("inference_count", 0)) for s in stats),
        "execution_count": sum(int(s.get("execution_count", 0)) for s in stats),
    }


# ---------------------------------------------------------------------------------------------
# models


@dataclass
class TensorInfo:
    name: str
    dtype: np.dtype
    dims: list[int]  # without the batch dimension


# The backend of a config -> the model file its version folder holds by default.
DEFAULT_FILES = {"onnxruntime": "model.onnx", "pytorch": "model.pt", "openvino": "model.xml"}


@dataclass
class ModelInfo:
    name: str
    path: Path  # the model file (model.onnx, model.pt, model.xml)
    max_batch_size: int
    instance_count: int
    dynamic_batching: bool
    inputs: list[TensorInfo]
    outputs: list[str]
    backend: str = "onnxruntime"  # onnxruntime, pytorch or openvino
    config_path: Path | None = None

    def sample(self, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return make_inputs(self, batch, rng)


def example_repository(models: Sequence[str]) -> Path:
    from oceanus.examples import example_repository as _example_repository

    return Path(_example_repository(list(models)))


def load_model_info(repository: Path, name: str) -> ModelInfo:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    config = mc.ModelConfig()
    text_format.Parse((repository / name / "config.pbtxt").read_text(), config)
    versions = sorted(
        (p for p in (repository / name).iterdir() if p.is_dir() and p.name.isdigit()),
        key=lambda p: int(p.name),
    )
    backend = config.backend or {
        "onnxruntime_onnx": "onnxruntime",
        "pytorch_libtorch": "pytorch",
    }.get(config.platform, "onnxruntime")
    path = versions[-1] / (config.default_model_filename or DEFAULT_FILES[backend])
    inputs = []
    for tensor in config.input:
        type_name = mc.DataType.Name(tensor.data_type).removeprefix("TYPE_").lower()
        floats = {"fp32": np.float32, "fp64": np.float64, "fp16": np.float16}
        dtype = np.dtype(floats.get(type_name) or type_name)
        inputs.append(TensorInfo(tensor.name, dtype, list(tensor.dims)))
    instances = sum(g.count or 1 for g in config.instance_group) or 1
    return ModelInfo(
        name=name,
        path=path,
        max_batch_size=config.max_batch_size,
        instance_count=instances,
        dynamic_batching=config.HasField("dynamic_batching"),
        inputs=inputs,
        outputs=[t.name for t in config.output],
        backend=backend,
        config_path=repository / name / "config.pbtxt",
    )


def make_inputs(model: ModelInfo, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random inputs valid for the example models (token ids below the vocabulary, 0/1 masks)."""
    feed: dict[str, np.ndarray] = {}
    for tensor in model.inputs:
        shape = ([batch] if model.max_batch_size > 0 else []) + tensor.dims
        if tensor.name == "input_ids":
            feed[tensor.name] = rng.integers(0, TEXT_VOCAB, shape).astype(tensor.dtype)
        elif tensor.name == "attention_mask":
            lengths = rng.integers(16, shape[-1] + 1, shape[:-1])
            feed[tensor.name] = (np.arange(shape[-1]) < lengths[..., None]).astype(tensor.dtype)
        elif tensor.dtype.kind == "f":
            feed[tensor.name] = rng.standard_normal(shape).astype(tensor.dtype)
        elif tensor.dtype.kind in "iu":
            feed[tensor.name] = rng.integers(0, 100, shape).astype(tensor.dtype)
        elif tensor.dtype.kind == "b":
            feed[tensor.name] = rng.integers(0, 2, shape).astype(tensor.dtype)
        else:
            raise ValueError(f"no sample generator for {tensor.name} ({tensor.dtype})")
    return feed


def perf_analyzer_input_file(model: ModelInfo, path: Path, count: int = 16) -> Path | None:
    """A perf_analyzer --input-data JSON file where random data would be invalid, else None."""
    if not any(t.name in ("input_ids", "attention_mask") for t in model.inputs):
        return None
    rng = np.random.default_rng(1)
    data = []
    for _ in range(count):
        sample = make_inputs(model, 1, rng)
        data.append({name: array.reshape(-1).tolist() for name, array in sample.items()})
    path.write_text(json.dumps({"data": data}))
    return path


# ---------------------------------------------------------------------------------------------
# numbers


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_status_sum(pid: int, field: str) -> int:
    """A counter of /proc/<pid>/task/*/status (e.g. `voluntary_ctxt_switches`) summed over the
    process's threads so far (0 once it is gone)."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return 0
    total = 0
    for task in tasks:
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith(f"{field}:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total


def child_pids(pid: int) -> list[int]:
    """A process's children, whichever of its threads started them."""
    found: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        with contextlib.suppress(OSError):
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def descendant_pids(pid: int) -> list[int]:
    """A process's children, their children and so on."""
    found, todo = [], child_pids(pid)
    while todo:
        child = todo.pop()
        found.append(child)
        todo += child_pids(child)
    return found


def status_kib(pid: int | str, field: str) -> int:
    """A kB field of /proc/<pid>/status (VmRSS, VmHWM); 0 once the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def tree_kib(pid: int, field: str) -> int:
    """`field` summed over a process and its descendants (a server and its workers)."""
    return sum(status_kib(each, field) for each in [pid, *descendant_pids(pid)])


def loadavg() -> list[float]:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return []


def fmt_num(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for index, row in enumerate(cells):
        lines.append(
            "  ".join(c.rjust(w) if index else c.ljust(w) for c, w in zip(row, widths, strict=True))
        )
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_results(prefix: str, document: Any, indent: int | None = 2) -> Path:
    """bench/results/<prefix>-<timestamp>.json (git-ignored: the dated .md logs are the
    record); says where."""
    RESULTS_DIR.mkdir(exist_ok=True)
    out = RESULTS_DIR / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(document, indent=indent, default=str) + "\n")
    print(f"wrote {out.relative_to(RESULTS_DIR.parent.parent)}")
    return out


def write_side_by_side(prefix: str, args: Any, load_before: list[float], **results: Any) -> Path:
    """bench/results/<prefix>-<timestamp>.json for a side-by-side script: its settings
    (concurrency, window, repeats), the load averages around the run, and `results`."""
    document = {
        "concurrency": args.concurrency,
        "window_ms": args.window_ms,
        "repeat": args.repeat,
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        **results,
    }
    return write_results(prefix, document)
