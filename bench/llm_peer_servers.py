"""The servers bench/llm_peers.py compares, each started as a process on a loopback port: Oceanus
(engine "auto", "transformers" or "openvino"), vLLM's CPU build and llama.cpp's `llama-server` on a
GGUF of the same weights; and the peak resident memory of a server's process tree.

A server is named `kind[:variant][@threads]`:
  oceanus[:dtype][@N]       model.json `dtype` (default "auto") and `num_threads` N, engine
                            "auto" (the default); `oceanus:int8` (`:int4`) is dtype auto
                            with `quantization: "int8"` ("int4")
  oceanus+pt[:dtype][@N]    the same with `engine: "transformers"`
  oceanus+ov[:dtype][@N]    the same with `engine: "openvino"`
  vllm[:dtype][@bind]       `--dtype` (default auto); VLLM_CPU_OMP_THREADS_BIND: auto (the
                            default; on 2 cores it binds one OpenMP thread to core 0 and
                            leaves core 1 to the API process), 1 (core 0), 2 (cores 0-1)
  llama:TYPE[@N]            llama-server on the GGUF of TYPE (BF16, Q8_0, Q4_0, ...), `-t N`
                            (default 2)
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import benchlib

# vLLM's CPU build runs faster with tcmalloc preloaded (../shared/vllm-reference/start.sh).
TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")


# Oceanus's kinds name its model.json `engine`.
ENGINE_OF = {"oceanus": "auto", "oceanus+pt": "transformers", "oceanus+ov": "openvino"}
KINDS = (*ENGINE_OF, "vllm", "llama")


@dataclass(frozen=True)
class Spec:
    name: str  # as given on the command line
    kind: str  # one of KINDS
    variant: str  # dtype, or the GGUF tensor type
    threads: str  # "" for the server's default


def parse_spec(name: str) -> Spec:
    head, _, threads = name.partition("@")
    kind, _, variant = head.partition(":")
    if kind not in KINDS:
        raise ValueError(f"unknown server {name!r}")
    if kind == "llama" and not variant:
        raise ValueError(f"{name!r}: llama needs a GGUF type, e.g. llama:Q8_0")
    return Spec(name, kind, variant, threads)


@dataclass
class Paths:
    """Where each peer's pieces are (the script's flags)."""

    model: Path  # the Hugging Face folder
    gguf: dict[str, Path]  # tensor type -> file
    llama_server: Path | None
    vllm_python: Path | None
    log_dir: Path
    ctx_per_slot: int = 512
    slots: int = 32


@dataclass
class Launch:
    argv: list[str]
    env: dict[str, str]
    health: str
    model_name: str
    notes: dict[str, str] = field(default_factory=dict)


def _oceanus(spec: Spec, paths: Paths, port: int) -> Launch:
    from oceanus.examples.llm import write_llm_model

    repo = paths.log_dir / f"repo-{port}"
    quantized = spec.variant in ("int8", "int4")
    engine_args: dict[str, object] = {
        "model": str(paths.model),
        "dtype": "auto" if quantized or not spec.variant else spec.variant,
        "max_model_len": paths.ctx_per_slot,
        "max_num_seqs": paths.slots,
        "engine": ENGINE_OF[spec.kind],
    }
    if quantized:
        engine_args["quantization"] = spec.variant
    if spec.threads:
        engine_args["num_threads"] = int(spec.threads)
    write_llm_model(repo, "llm", engine_args=engine_args)
    argv = [
        *benchlib.oceanus_argv(repo, port, benchlib.free_port()),
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        f"--metrics-port={benchlib.free_port()}",
        "--metrics-address=127.0.0.1",
    ]
    notes = {"model.json": json.dumps(engine_args)}
    return Launch(argv, {}, "/v2/health/ready", "llm", notes)


def _vllm(spec: Spec, paths: Paths, port: int) -> Launch:
    if paths.vllm_python is None:
        raise RuntimeError("--vllm-python is needed for vllm")
    # As ../shared/vllm-reference/start.sh starts it (`vllm serve` fails in this distribution).
    argv = [
        str(paths.vllm_python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(paths.model),
        "--served-model-name",
        "ref",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(paths.ctx_per_slot),
        "--max-num-seqs",
        str(paths.slots),
        "--dtype",
        spec.variant or "auto",
    ]
    bind = {"": "auto", "auto": "auto", "1": "0", "2": "0-1"}[spec.threads]
    venv = paths.vllm_python.parent.parent
    preload = [str(p) for p in (TCMALLOC, venv / "lib" / "libiomp5.so") if p.exists()]
    env = {
        "VLLM_CPU_KVCACHE_SPACE": "4",
        "VLLM_CPU_OMP_THREADS_BIND": bind,
        "LD_PRELOAD": ":".join(preload),
    }
    return Launch(argv, env, "/health", "ref", {"env": json.dumps(env)})


def _llama(spec: Spec, paths: Paths, port: int) -> Launch:
    if paths.llama_server is None:
        raise RuntimeError("--llama-server is needed for llama")
    gguf = paths.gguf[spec.variant]
    threads = spec.threads or "2"
    argv = [
        str(paths.llama_server),
        "-m",
        str(gguf),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-t",
        threads,
        "-tb",
        threads,
        "--parallel",
        str(paths.slots),
        # the context is shared by the slots: each gets ctx / parallel tokens
        "-c",
        str(paths.ctx_per_slot * paths.slots),
        "--cont-batching",
        "--jinja",
        "--no-webui",
    ]
    return Launch(argv, {}, "/health", "gguf", {"gguf": gguf.name})


def launch(spec: Spec, paths: Paths, port: int) -> Launch:
    if spec.kind.startswith("oceanus"):
        return _oceanus(spec, paths, port)
    if spec.kind == "vllm":
        return _vllm(spec, paths, port)
    return _llama(spec, paths, port)


class PeakRss:
    """Polls the resident memory of a process and its descendants (vLLM's engine core and
    Oceanus's OpenVINO worker are child processes), keeping the largest sum seen."""

    def __init__(self, pid: int, interval: float = 0.25) -> None:
        self.pid, self.interval, self.peak_mib = pid, interval, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak_mib = max(self.peak_mib, benchlib.tree_kib(self.pid, "VmRSS") / 1024)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak_mib


@contextlib.contextmanager
def started(spec: Spec, paths: Paths) -> Iterator[tuple[str, Launch, PeakRss]]:
    """The server of `spec` on a free loopback port, healthy; stopped (with its children) after."""
    port = benchlib.free_port()
    how = launch(spec, paths, port)
    log = paths.log_dir / f"{spec.name.replace(':', '-').replace('@', '-t')}-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            how.argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=benchlib.ROOT,
            env=dict(os.environ, **how.env),
            start_new_session=True,  # its own process group: stopped with its children
        )
    rss = PeakRss(proc.pid)
    try:
        try:
            benchlib.wait_http_ok(f"http://127.0.0.1:{port}{how.health}", proc, timeout=600)
        except (RuntimeError, TimeoutError) as exc:
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{spec.name} did not start ({exc}): {tail}") from None
        yield f"http://127.0.0.1:{port}", how, rss
    finally:
        rss.stop()
        _stop_group(proc)


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT to the group we created (the server and its children), then SIGKILL."""
    import signal

    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    # children that outlive the leader (vLLM's engine core) share its group
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit("run bench/llm_peers.py")
