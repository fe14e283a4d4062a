"""The server `oceanus tune` measures: one it starts itself, or a running one (`--url`), driven
through Triton's HTTP API only (metadata, config, statistics, and the repository extension's
load with a `config` override to switch configurations without a restart)."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


class TuneError(Exception):
    """Something the user must fix (printed as one line, exit code 1)."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class Target:
    """A server's HTTP endpoint (`host:port`)."""

    def __init__(self, url: str, metrics_url: str = "") -> None:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if not parts.hostname or not parts.port:
            raise TuneError(f"--url expects host:port of the HTTP endpoint, got '{url}'")
        self.host = parts.hostname
        self.port = parts.port
        self.metrics_url = metrics_url

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _call(self, method: str, path: str, body: Any = None, timeout: float = 120.0) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"http://{self.address}{path}", data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                text = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            with contextlib.suppress(ValueError, AttributeError):
                detail = json.loads(detail).get("error", detail)
            raise TuneError(f"{method} {path}: {exc.code} {detail}") from None
        except OSError as exc:
            raise TuneError(f"cannot reach the server at {self.address}: {exc}") from None
        return json.loads(text) if text else None

    def live(self) -> bool:
        try:
            self._call("GET", "/v2/health/live", timeout=2)
            return True
        except TuneError:
            return False

    def ready(self, model: str) -> bool:
        try:
            self._call("GET", f"/v2/models/{model}/ready", timeout=5)
            return True
        except TuneError:
            return False

    def model_config(self, model: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/v2/models/{model}/config"))

    def model_metadata(self, model: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/v2/models/{model}"))

    def statistics(self, model: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/v2/models/{model}/stats")["model_stats"][0])

    def load(self, model: str, config: dict[str, Any] | None = None) -> None:
        """Load (or reload) the model, with `config` replacing its config.pbtxt when given."""
        body = {"parameters": {"config": json.dumps(config)}} if config is not None else {}
        try:
            self._call("POST", f"/v2/repository/models/{model}/load", body)
        except TuneError as exc:
            if "explicit model load / unload is not allowed" in str(exc):
                raise TuneError(
                    "the server at --url must run with --model-control-mode=explicit, so that "
                    "oceanus tune can load each configuration in turn"
                ) from None
            raise


class ManagedServer:
    """`python -m oceanus` on free loopback ports, serving only the model being tuned, in
    explicit model-control mode; its log goes to `log_path`."""

    def __init__(self, repository: Path, model: str, log_path: Path) -> None:
        self.repository = repository
        self.model = model
        self.log_path = log_path
        self.http_port = free_port()
        self.metrics_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.target = Target(
            f"127.0.0.1:{self.http_port}", f"http://127.0.0.1:{self.metrics_port}/"
        )

    def start(self, timeout_s: float) -> Target:
        command = [
            sys.executable,
            "-m",
            "oceanus",
            f"--model-repository={self.repository}",
            "--model-control-mode=explicit",
            f"--load-model={self.model}",
            f"--http-port={self.http_port}",
            f"--grpc-port={free_port()}",
            f"--metrics-port={self.metrics_port}",
            "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1",
            "--metrics-address=127.0.0.1",
        ]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise TuneError(
                    f"the server exited with code {self.process.returncode} "
                    f"(its log: {self.log_path}):\n{self._log_tail()}"
                )
            if self.target.live():
                return self.target
            time.sleep(0.1)
        self.stop()
        raise TuneError(f"the server did not start within {timeout_s:.0f} s ({self.log_path})")

    def _log_tail(self, lines: int = 8) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
