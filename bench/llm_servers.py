"""bench/llm.py's HTTP targets, started as processes: the Oceanus server, the naive FastAPI
server (bench/llm_naive_server.py) and `transformers serve --continuous-batching`."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import benchlib  # bench/ is on the path: llm.py, the entry point, puts it there

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def process(argv: list[str], port: int, health: str, log: Path) -> Iterator[str]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        try:
            benchlib.wait_http_ok(f"http://127.0.0.1:{port}{health}", proc, timeout=300)
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(
                f"{argv[:4]} did not start ({exc}): {log.read_text()[-1500:]}"
            ) from None
        yield f"http://127.0.0.1:{port}"
    finally:
        benchlib.stop_process(proc)


def server_argv(target: str, folder: Path, repo: Path, port: int) -> tuple[list[str], str]:
    if target == "oceanus":
        grpc, metrics = benchlib.free_port(), benchlib.free_port()
        argv = [
            sys.executable,
            "-m",
            "oceanus",
            f"--model-repository={repo}",
            f"--http-port={port}",
            f"--grpc-port={grpc}",
            f"--metrics-port={metrics}",
            "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1",
            "--metrics-address=127.0.0.1",
        ]
        return argv, "/v2/health/ready"
    if target == "naive":
        return [
            sys.executable,
            str(ROOT / "bench" / "llm_naive_server.py"),
            "--model",
            str(folder),
            "--port",
            str(port),
        ], "/health"
    return [
        "transformers",
        "serve",
        "--continuous-batching",
        "--device",
        "cpu",
        "--port",
        str(port),
        str(folder),
    ], "/health"
