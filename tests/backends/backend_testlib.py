"""Helpers shared by the framework backend tests (PyTorch, OpenVINO, TensorRT, ORT accelerators)."""

from __future__ import annotations

import asyncio
import http.client
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

ROOT = Path(__file__).resolve().parents[2]
NO_METRICS = ["--allow-metrics=false"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def index(url: str) -> dict[str, dict[str, Any]]:
    """The repository index by model name (state, reason)."""
    client = httpclient.InferenceServerClient(url)
    return {entry["name"]: entry for entry in client.get_model_repository_index()}


def _inputs(module: Any, arrays: dict[str, np.ndarray], datatypes: dict[str, str]) -> list[Any]:
    inputs = []
    for name, array in arrays.items():
        datatype = datatypes.get(name) or np_to_triton_dtype(array.dtype)
        if datatype == "BF16":
            tensor = module.InferInput(name, list(array.shape), "BF16")
            tensor.set_data_from_numpy(array.astype(ml_dtypes.bfloat16))
        else:
            tensor = module.InferInput(name, list(array.shape), datatype)
            tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def http_infer(
    url: str,
    model: str,
    arrays: dict[str, np.ndarray],
    datatypes: dict[str, str] | None = None,
) -> Any:
    client = httpclient.InferenceServerClient(url, network_timeout=120)
    return client.infer(model, _inputs(httpclient, arrays, datatypes or {}))


def grpc_infer(url: str, model: str, arrays: dict[str, np.ndarray]) -> Any:
    client = grpcclient.InferenceServerClient(url)
    try:
        return client.infer(model, _inputs(grpcclient, arrays, {}))
    finally:
        client.close()


def http_error(
    url: str, model: str, arrays: dict[str, np.ndarray], datatypes: dict[str, str] | None = None
) -> InferenceServerException:
    try:
        http_infer(url, model, arrays, datatypes)
    except InferenceServerException as exc:
        return exc
    raise AssertionError(f"inference on '{model}' succeeded; an error was expected")


def infer_pairs_at_once(
    url: str, models: Sequence[str], names: tuple[str, str], pairs: Sequence[tuple[Any, Any]]
) -> list[Any]:
    """Send every (a, b) INT32 pair as inputs `names` at the same time (tritonclient.http.aio);
    the i-th request goes to models[i % len(models)]. Results in the order of `pairs`."""

    async def run() -> list[Any]:
        client = aioclient.InferenceServerClient(url)
        try:
            calls = []
            for i, (a, b) in enumerate(pairs):
                inputs = []
                for name, value in zip(names, (a, b), strict=True):
                    tensor = aioclient.InferInput(name, list(value.shape), "INT32")
                    tensor.set_data_from_numpy(value)
                    inputs.append(tensor)
                calls.append(client.infer(models[i % len(models)], inputs))
            return list(await asyncio.gather(*calls))
        finally:
            await client.close()

    return asyncio.run(run())


def stats(url: str, model: str) -> dict[str, Any]:
    client = httpclient.InferenceServerClient(url)
    return dict(client.get_inference_statistics(model)["model_stats"][0])


def batch_sizes(url: str, model: str) -> dict[int, int]:
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats(url, model)["batch_stats"]}


# A sys.meta_path finder that refuses to import the named top-level packages: a real run of the
# server with those frameworks absent, as on a machine where they were never installed.
_BLOCKING_MAIN = textwrap.dedent(
    """
    import importlib.abc, sys

    BLOCKED = set(sys.argv[1].split(","))

    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named '{name}'", name=name)
            return None

    sys.meta_path.insert(0, Refuse())
    from oceanus.cli import main

    sys.exit(main(sys.argv[2:]))
    """
)


class BlockedServer:
    """`oceanus.cli.main` in a subprocess where some frameworks cannot be imported."""

    def __init__(
        self,
        blocked: Sequence[str],
        repositories: Sequence[Path],
        log_dir: Path,
        args: Sequence[str] = (),
    ) -> None:
        self.http_port = free_port()
        self.grpc_port = free_port()
        self.log_path = log_dir / f"oceanus-blocked-{self.http_port}.log"
        command = [sys.executable, "-c", _BLOCKING_MAIN, ",".join(blocked)]
        command += [f"--model-repository={r}" for r in repositories]
        command += [
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1",
            "--allow-metrics=false",
            *args,
        ]
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            command, stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT, env=dict(os.environ)
        )

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_live(self, timeout: float = 120.0) -> BlockedServer:
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

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return int(self.process.returncode)


def write_model(
    repository: Path, name: str, config: str, files: Mapping[str, bytes | Path]
) -> Path:
    """A model folder: config.pbtxt (unless config is empty) and version 1's files."""
    folder = repository / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    if config:
        (folder / "config.pbtxt").write_text(config)
    for file_name, content in files.items():
        data = content.read_bytes() if isinstance(content, Path) else content
        (folder / "1" / file_name).write_bytes(data)
    return folder
