"""A container's small /dev/shm (issues 30 and 41): the server in a private mount namespace with
a small tmpfs on /dev/shm, every shared-memory user driven until the rings have cycled.

12 MiB: `shm-default-byte-size` is 1 MiB, so two models (one instance each) reserve 2 MiB; a third
with twelve instances is refused at load with the remedy; 6 MiB tensors grow one model's rings
as far as the budget allows, and what does not fit takes a one-off file or goes inline
(counted). No SIGBUS, no restart, nothing left in /dev/shm.

48 MiB (with Oceanus's old 8 MiB rings that held two Python models beside two frontend workers):
with Triton's defaults a dozen small models and two workers load, and one model whose tensors
outgrow its rings still serves, its rings grown (issue 41).
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
    """The server alone in a mount namespace whose /dev/shm is a tmpfs of `shm_size` bytes."""

    def __init__(
        self, repositories: Sequence[Path | str], args: Sequence[str], shm_size: int = SHM_SIZE
    ) -> None:
        self.shm_size = shm_size
        super().__init__(repositories, args)

    def command_line(self, repositories: Sequence[Path | str], args: Sequence[str]) -> list[str]:
        inner = super().command_line(repositories, args)
        mount = f"mount -t tmpfs -o size={self.shm_size} tmpfs /dev/shm"
        # unshare and sh exec: the pid is the server's, SIGTERM reaches it.
        return ["unshare", "-m", "sh", "-c", f'{mount} && exec "$@"', "sh", *inner]

    def shm_files(self) -> list[str]:
        """What the server's /dev/shm holds (seen through its root in /proc)."""
        return sorted(os.listdir(self.shm_path()))

    def shm_path(self, name: str = "") -> str:
        return f"/proc/{self.process.pid}/root/dev/shm/{name}"


def _model(root: Path, name: str, count: int = 1, small: bool = False) -> None:
    """An identity model.py: any length of FP32, or (`small`) 16 of them with dynamic batching,
    as the issue's 40-model repository has them."""
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(IDENTITY)
    shape = "max_batch_size: 8\n" if small else "max_batch_size: 0\n"
    dims = "16" if small else "-1"
    (root / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\n{shape}'
        f'input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {dims} ] }} ]\n'
        f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {dims} ] }} ]\n'
        f"instance_group [ {{ count: {count} kind: KIND_CPU }} ]\n"
        + ("dynamic_batching { }\n" if small else "")
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NamespacedServer]:
    reason = _unshare_works()
    if reason is not None:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("shm-budget")
    _model(root, "pysmall")
    _model(root, "pybig")
    _model(root, "pymany", count=12)
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
    assert _metrics(server)["oceanus_shm_reserved_bytes"] < 2.1 * RING


def test_every_user_cycles_without_sigbus(server: NamespacedServer) -> None:
    small = np.arange(16 << 10, dtype=np.float32)  # 64 KiB: 40 of them cycle a 512 KiB ring
    # 6 MiB: the rings to the stub grows to 6.5 MiB; the one back cannot grow as far, nor hold a
    # one-off file, in what is left: the outputs go inline.
    big = np.arange(6 << 18, dtype=np.float32)
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
    # pysmall's 1 MiB, pybig's grown ring (6.5 MiB) beside its other one (512 KiB)
    assert 8 * RING <= figures["oceanus_shm_reserved_bytes"] < 8.1 * RING
    assert figures["oceanus_shm_fallback"] > 0  # the big outputs found no room
    assert server.process.poll() is None
    log = server.log()
    assert "SIGBUS" not in log and "restarting it" not in log
    assert "reserved by the loaded models' rings" in log
    assert "model instance 'pybig_0_0': shared-memory rings now 6.5 MiB to the stub" in log

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


def _status(server: ServerProcess) -> dict[str, Any]:
    url = f"http://127.0.0.1:{server.metrics_port}/status.json"
    with urllib.request.urlopen(url, timeout=10) as response:
        status: dict[str, Any] = json.loads(response.read())
    return status


def test_many_small_models_load_and_a_growing_one_serves(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Triton's defaults (1 MiB per stub, growing by 1 MiB) and two frontend workers in 48 MiB:
    with the old fixed 8 MiB rings two Python models loaded here; now all thirteen do, and a
    model whose 4 MiB tensors do not fit its rings grows them and serves, with no fallback."""
    reason = _unshare_works()
    if reason is not None:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("shm-many")
    names = [f"small{i}" for i in range(12)]
    for name in names:
        _model(root, name, small=True)
    _model(root, "grows")
    server = NamespacedServer([root], ["--frontend-workers=2"], shm_size=48 << 20)
    try:
        server.wait_live()
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        for name in [*names, "grows"]:
            assert client.is_model_ready(name), (name, server.log())
        data = np.arange(16, dtype=np.float32).reshape(1, 16)
        for name in names:
            _identity(client, name, data)
        start = _metrics(server)
        # 13 stubs at 1 MiB and two workers' rings (2.5 MiB each)
        assert start["oceanus_shm_reserved_bytes"] < 19 * RING
        big = np.arange(1 << 20, dtype=np.float32)  # 4 MiB
        for i in range(6):
            _identity(client, "grows", big + i)
        for name in names:  # the others still serve beside it
            _identity(client, name, data)
        figures = _metrics(server)
        assert figures["oceanus_shm_fallback"] == 0
        # Both of its rings grew from 512 KiB by whole 1 MiB steps to hold 4 MiB: 4.5 MiB each.
        grown = figures["oceanus_shm_reserved_bytes"] - start["oceanus_shm_reserved_bytes"]
        assert grown == 8 * RING
        rings = _status(server)["shared_memory"]["rings"]
        assert rings["grows"]["reserved_bytes"] == 9 * RING + 128
        assert rings["grows"]["initial_bytes"] == RING + 128
        assert rings["small0"]["reserved_bytes"] == rings["small0"]["initial_bytes"] == RING + 128
        log = server.log()
        assert "SIGBUS" not in log and "restarting it" not in log
        assert "model instance 'grows_0_0': shared-memory rings now 4.5 MiB to the stub" in log
    finally:
        server.stop()
    assert server.process.returncode is not None
