"""A container's small /dev/shm (issue 30): the server in a private mount namespace with a 12 MiB
tmpfs on /dev/shm, every shared-memory user driven until the rings have cycled.

Rings are 1 MiB (`shm-default-byte-size`), so two models (one instance each) reserve 4 MiB; a
third needing 8 MiB more is refused at load with the remedy; 6 MiB tensors take one-off files and,
when those do not fit, go inline (counted). No SIGBUS, no restart, nothing left in /dev/shm.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conftest import ServerProcess

SHM_SIZE = 12 << 20
RING = 1 << 20
IDENTITY = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
"""


def _unshare_works() -> str | None:
    """Why a private mount namespace with its own tmpfs cannot be made here (None: it can)."""
    try:
        done = subprocess.run(
            ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare is not available: {exc}"
    if done.returncode != 0:
        return f"unshare -m / mount not permitted (needs root): {done.stderr.decode().strip()}"
    return None


class NamespacedServer(ServerProcess):
    """The server alone in a mount namespace whose /dev/shm is a SHM_SIZE tmpfs."""

    def command_line(self, repositories: Sequence[Path | str], args: Sequence[str]) -> list[str]:
        inner = super().command_line(repositories, args)
        mount = f"mount -t tmpfs -o size={SHM_SIZE} tmpfs /dev/shm"
        # unshare and sh exec: the pid is the server's, SIGTERM reaches it.
        return ["unshare", "-m", "sh", "-c", f'{mount} && exec "$@"', "sh", *inner]

    def shm_files(self) -> list[str]:
        """What the server's /dev/shm holds (seen through its root in /proc)."""
        return sorted(os.listdir(self.shm_path()))

    def shm_path(self, name: str = "") -> str:
        return f"/proc/{self.process.pid}/root/dev/shm/{name}"


def _model(root: Path, name: str, count: int = 1) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(IDENTITY)
    (root / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        f"instance_group [ {{ count: {count} kind: KIND_CPU }} ]\n"
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NamespacedServer]:
    reason = _unshare_works()
    if reason is not None:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("shm-budget")
    _model(root, "pysmall")
    _model(root, "pybig")
    _model(root, "pymany", count=4)
    process = NamespacedServer(
        [root],
        [
            "--model-control-mode=explicit",
            "--load-model=pysmall",
            "--load-model=pybig",
            f"--backend-config=python,shm-default-byte-size={RING}",
            # The figures below count the Python backend's rings only; frontend workers reserve
            # rings of their own in the same /dev/shm (tests/frontends/test_workers.py).
            "--frontend-workers=0",
        ],
    )
    process.wait_live()
    yield process
    process.stop()


def _post(server: ServerProcess, path: str, body: bytes = b"") -> tuple[int, str]:
    request = urllib.request.Request(f"http://{server.http_url}{path}", data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _metrics(server: ServerProcess) -> dict[str, float]:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("oceanus_shm_")
    }


def _identity(client: Any, model: str, data: np.ndarray) -> None:
    tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    result = client.infer(model, [tensor])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


def test_rings_do_not_fit_is_a_clear_load_error(server: NamespacedServer) -> None:
    status, body = _post(server, "/v2/repository/models/pymany/load")
    assert status == 400, body
    error = json.loads(body)["error"]
    assert "failed to reserve shared memory for model instance 'pymany_" in error
    assert "MiB free of 12.0 MiB" in error
    assert "--shm-size" in error and "shm-default-byte-size" in error
    # The instances that had started were closed: what they reserved is back.
    assert _metrics(server)["oceanus_shm_reserved_bytes"] < 4.1 * RING


def test_every_user_cycles_without_sigbus(server: NamespacedServer) -> None:
    small = np.arange(16 << 10, dtype=np.float32)  # 64 KiB: 40 of them cycle a 1 MiB ring
    big = np.arange(6 << 18, dtype=np.float32)  # 6 MiB: one-off file in, inline out
    errors: list[BaseException] = []

    def drive(model: str, data: np.ndarray, count: int) -> None:
        own = httpclient.InferenceServerClient(server.http_url)
        try:
            for _ in range(count):
                _identity(own, model, data)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=drive, args=("pysmall", small, 40)) for _ in range(2)]
    threads += [threading.Thread(target=drive, args=("pybig", big, 6)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    figures = _metrics(server)
    assert figures["oceanus_shm_size_bytes"] == SHM_SIZE
    assert 4 * RING <= figures["oceanus_shm_reserved_bytes"] < 4.1 * RING
    assert figures["oceanus_shm_fallback"] > 0  # the big outputs found no room
    assert server.process.poll() is None
    log = server.log()
    assert "SIGBUS" not in log and "restarting it" not in log
    assert "reserved by the loaded models' rings" in log

    # A client's system shared memory region in the server's /dev/shm: one that fits serves; a
    # sparse one larger than what is free is refused at registration (it would SIGBUS later).
    fits, sparse = "oc-budget-fits", "oc-budget-sparse"
    with open(server.shm_path(fits), "wb") as file:
        file.truncate(small.nbytes)
    with open(server.shm_path(sparse), "wb") as file:
        file.truncate(SHM_SIZE)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        grpc.register_system_shared_memory("fits", f"/{fits}", small.nbytes)
        tensor = grpcclient.InferInput("INPUT0", list(small.shape), "FP32")
        tensor.set_data_from_numpy(small)
        output = grpcclient.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory("fits", small.nbytes)
        grpc.infer("pysmall", [tensor], outputs=[output])
        written = np.fromfile(server.shm_path(fits), dtype=np.float32)
        np.testing.assert_array_equal(written, small)
        with pytest.raises(Exception, match="has no room for its"):
            grpc.register_system_shared_memory("sparse", f"/{sparse}", SHM_SIZE)
        grpc.unregister_system_shared_memory()
    finally:
        os.unlink(server.shm_path(fits))
        os.unlink(server.shm_path(sparse))

    # Nothing of ours is left in /dev/shm, loaded or unloaded.
    assert server.shm_files() == []
    for model in ("pysmall", "pybig"):
        assert _post(server, f"/v2/repository/models/{model}/unload")[0] == 200
    assert server.shm_files() == []
    assert _metrics(server)["oceanus_shm_used_bytes"] == 0
