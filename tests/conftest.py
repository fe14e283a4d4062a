"""Test fixtures: the real server started as a subprocess on free loopback ports."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from oceanus.examples import SMALL_MODELS, example_repository

# The small generated models most tests use (the two big ones only in their own smoke test).
TEST_MODELS = tuple(SMALL_MODELS)
# Servers start with the default --frontend-workers (auto) unless this names a count: scripts/
# test.sh runs the suite with 2 (auto runs none on a 2-CPU machine) and tests/frontends a
# second time with 0, so every endpoint is checked both ways.
FRONTEND_WORKERS = os.environ.get("OCEANUS_TEST_FRONTEND_WORKERS", "")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """`python -m oceanus` with its own ports and log file."""

    def __init__(
        self,
        repositories: Sequence[Path | str],
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        log_dir: Path | None = None,
    ) -> None:
        self.http_port = free_port()
        self.grpc_port = free_port()
        self.metrics_port = free_port()
        self.log_path = (log_dir or Path("/tmp")) / f"oceanus-{self.http_port}.log"
        self.command = command = self.command_line(repositories, args)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )

    def command_line(self, repositories: Sequence[Path | str], args: Sequence[str]) -> list[str]:
        """The server's command (subclasses run other launch lines)."""
        command = [sys.executable, "-m", "oceanus"]
        for repository in repositories:
            command.append(f"--model-repository={repository}")
        command += [
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1",
            "--metrics-address=127.0.0.1",
            *args,
        ]
        if FRONTEND_WORKERS and not any(a.startswith("--frontend-workers") for a in args):
            command.append(f"--frontend-workers={FRONTEND_WORKERS}")
        return command

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_live(self, timeout: float = 180.0) -> ServerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log()}")
            try:
                connection = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=1)
                connection.request("GET", "/v2/health/live")
                if connection.getresponse().status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server not live after {timeout} s:\n{self.log()}")

    def stop(self, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return int(self.process.returncode)


def start_server(
    repositories: Sequence[Path | str],
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> ServerProcess:
    return ServerProcess(repositories, args, env).wait_live()


@pytest.fixture(scope="session")
def model_repository() -> Path:
    """The generated repository of small models (cached across runs)."""
    return example_repository(TEST_MODELS)


@pytest.fixture(scope="session")
def server(model_repository: Path) -> Iterator[ServerProcess]:
    """One server for the read-only tests of the whole session."""
    process = start_server([model_repository])
    yield process
    process.stop()


@pytest.fixture
def launch() -> Iterator[object]:
    """Start extra servers inside one test: `launch(repos, args, env, wait=True)`; all are
    stopped when the test ends."""
    started: list[ServerProcess] = []

    def _launch(
        repositories: Sequence[Path | str],
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        wait: bool = True,
    ) -> ServerProcess:
        process = ServerProcess(repositories, args, env)
        started.append(process)
        return process.wait_live() if wait else process

    yield _launch
    for process in started:
        process.stop()


@pytest.fixture(scope="module")
def launch_module() -> Iterator[object]:
    """Like `launch`, for servers shared by the tests of one module."""
    started: list[ServerProcess] = []

    def _launch(
        repositories: Sequence[Path | str],
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> ServerProcess:
        process = ServerProcess(repositories, args, env)
        started.append(process)
        return process.wait_live()

    yield _launch
    for process in started:
        process.stop()
