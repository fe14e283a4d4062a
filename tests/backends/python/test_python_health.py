"""A Python model's worker process dying or hanging: the request in flight fails with a clear
error, the model reports not ready, the worker is restarted and the model serves again."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.backends.python.conftest import copy_models


def infer(server: Any, value: int) -> tuple[int, dict[str, Any]]:
    body = json.dumps(
        {"inputs": [{"name": "X", "datatype": "INT64", "shape": [1], "data": [value]}]}
    )
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/crashy/infer", data=body.encode(), method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def ready(server: Any, path: str = "/v2/models/crashy/ready") -> int:
    try:
        with urllib.request.urlopen(f"http://{server.http_url}{path}", timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def wait_ready(server: Any, timeout: float = 60.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if ready(server) == 200:
            return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(f"crashy not ready again after {timeout} s")


def worker_pid(server: Any) -> int:
    status, body = infer(server, 0)
    assert status == 200, body
    return int(body["outputs"][0]["data"][0])


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_models(tmp_path_factory.mktemp("crashy"), ["crashy", "add_sub"])


@pytest.fixture(scope="module")
def server(launch_module: Any, repository: Path) -> Any:
    return launch_module([repository])


# Triton 2.51 answers "Stub process 'crashy_0' is not healthy." (and, unlike Oceanus, keeps
# reporting the model ready and never recovers: recorded from the reference server).
UNHEALTHY = "Stub process 'crashy_0' is not healthy. "


@pytest.mark.parametrize(
    ("value", "how"),
    [(1, "The process exited with status 3"), (3, "The process was killed by SIGSEGV")],
)
def test_worker_dies_in_execute(server: Any, value: int, how: str) -> None:
    first = worker_pid(server)
    status, body = infer(server, value)
    assert status == 500
    assert body["error"] == f"{UNHEALTHY}{how}; a new one is being started."
    wait_ready(server)
    assert infer(server, 42) == (
        200,
        {
            "model_name": "crashy",
            "model_version": "1",
            "outputs": [{"name": "Y", "datatype": "INT64", "shape": [1], "data": [42]}],
        },
    )
    assert worker_pid(server) != first


def test_worker_killed_mid_request(server: Any, repository: Path) -> None:
    pid = worker_pid(server)
    marker = repository / "crashy" / "1" / "executing"
    marker.unlink(missing_ok=True)

    def kill_once_executing() -> None:
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)

    threading.Thread(target=kill_once_executing, daemon=True).start()
    started = time.monotonic()
    status, body = infer(server, 4)  # marks `executing`, then sleeps 60 s in execute
    assert time.monotonic() - started < 45  # failed when killed, not after the sleep
    assert status == 500
    assert body["error"] == (
        f"{UNHEALTHY}The process was killed by SIGKILL; a new one is being started."
    )
    wait_ready(server)
    assert infer(server, 5)[0] == 200


def test_not_ready_while_restarting(server: Any) -> None:
    pid = worker_pid(server)
    os.kill(pid, signal.SIGKILL)
    # The worker is noticed gone at once (its process ends); the new one needs a moment.
    deadline = time.monotonic() + 5
    seen_not_ready = False
    while time.monotonic() < deadline and not seen_not_ready:
        seen_not_ready = ready(server) == 400
        time.sleep(0.005)
    assert seen_not_ready
    wait_ready(server)
    assert ready(server, "/v2/health/ready") == 200
    # the other model never stopped being ready
    assert ready(server, "/v2/models/add_sub/ready") == 200


def test_requests_during_restart_wait_for_the_new_worker(server: Any) -> None:
    pid = worker_pid(server)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # until the server has reaped the old worker
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.002)
    assert infer(server, 6)[0] == 200


def test_hang_beyond_execute_timeout(server: Any) -> None:
    started = time.monotonic()
    status, body = infer(server, 2)  # sleeps 30 s; the model's execute_timeout_seconds is 3
    elapsed = time.monotonic() - started
    assert 2.9 < elapsed < 10
    assert status == 503
    assert body["error"] == (
        "Stub process 'crashy_0' did not return from execute() within 3 s (model parameter "
        "'execute_timeout_seconds'). It was killed; a new one is being started."
    )
    wait_ready(server)
    assert infer(server, 8)[0] == 200
    assert "execute() did not return within 3" in server.log()


def test_restarts_leave_no_open_files(server: Any) -> None:
    """Each restart closes what the dead worker's rings and wake-up pipe held in the server
    (they were left open: two mappings and two pipe ends per restart)."""
    wait_ready(server)

    def open_files() -> int:
        # Sockets left out: the HTTP connections of the probes close asynchronously (flaky).
        folder = f"/proc/{server.process.pid}/fd"
        links = []
        for fd in os.listdir(folder):
            with contextlib.suppress(FileNotFoundError):
                links.append(os.readlink(f"{folder}/{fd}"))
        return sum(not link.startswith("socket:") for link in links)

    before = open_files()
    for _ in range(3):
        pid = worker_pid(server)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until the server has reaped it
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.002)
        assert worker_pid(server) != pid  # served by the new worker
        # The new worker's process shows before its rings and pipe are open: count once ready.
        wait_ready(server)
    assert open_files() == before


def test_no_shared_memory_left_behind(server: Any) -> None:
    wait_ready(server)
    names = [n for n in os.listdir("/dev/shm") if n.startswith(f"oceanus-py-{server.process.pid}-")]
    assert names == []


def test_failed_initialize_is_a_load_error(launch: Any, tmp_path: Path) -> None:
    folder = tmp_path / "failinit" / "1"
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(
        "class TritonPythonModel:\n"
        "    def initialize(self, args):\n"
        "        raise RuntimeError('boom in initialize')\n"
        "    def execute(self, requests):\n"
        "        return []\n"
    )
    (tmp_path / "failinit" / "config.pbtxt").write_text('backend: "python"\n')
    server = launch([tmp_path], ["--exit-on-error=false"])
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/repository/index", data=b"{}", method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        index = json.loads(response.read())
    assert index[0]["state"] == "UNAVAILABLE"
    assert index[0]["reason"].startswith("RuntimeError: boom in initialize\n\nAt:\n  ")
    assert index[0]["reason"].endswith("/failinit/1/model.py(3): initialize\n")
