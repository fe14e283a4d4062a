"""Oceanus on a real Ray cluster started here on loopback: a head and a second node as separate
`ray start` processes, the application deployed from deploy/ray/serve_config.yaml with
`serve run`, tritonclient against Serve's HTTP proxy. Its own stage of scripts/test.sh (marker
`ray`, one cluster for the module). The nodes have one CPU each and a replica needs one, so two
replicas run on two nodes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
import yaml

from oceanus.examples import example_repository

pytestmark = pytest.mark.ray
ray = pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "ray" / "serve_config.yaml"
# Ray replaces a loopback node address with the machine's own (multi-node clusters need one the
# other nodes reach): its processes talk over that local address, which Linux delivers through
# the loopback device; nothing leaves the machine. Serve's proxy listens on 127.0.0.1.
ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
REPLICA = "ServeReplica:oceanus:oceanus"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run(*args: str, timeout: float = 180, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        args, env=env or ENV, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done.stdout


def _processes(marker: str) -> list[int]:
    """Processes whose command line contains `marker` (ours: the cluster's temp folder or
    the replica's actor name)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in command:
            found.append(int(entry.name))
    return found


class Cluster:
    def __init__(self) -> None:
        self.temp = Path(tempfile.mkdtemp(prefix="oceanus-ray-", dir="/tmp"))
        self.gcs = f"127.0.0.1:{_free_port()}"
        self.proxy_port = _free_port()
        self.shm_before = set(os.listdir("/dev/shm"))
        common = ["--num-cpus=1", "--object-store-memory=80000000", "--disable-usage-stats"]
        _run(
            "ray", "start", "--head", "--node-ip-address=127.0.0.1",
            f"--port={self.gcs.split(':')[1]}", "--include-dashboard=false",
            f"--temp-dir={self.temp}", *common,
        )  # fmt: skip
        _run("ray", "start", f"--address={self.gcs}", "--node-ip-address=127.0.0.1", *common)

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.proxy_port}"

    def deploy(self, repository: Path, deployment: dict[str, object]) -> None:
        """`serve run` of the shipped config, with this test's repository, port and
        deployment options."""
        config = yaml.safe_load(CONFIG.read_text())
        config["http_options"] = {"host": "127.0.0.1", "port": self.proxy_port}
        app = config["applications"][0]
        app["args"]["model_repository"] = str(repository)
        app["args"]["server_options"] = {"log_info": False}
        app["deployments"][0].update(deployment)
        path = self.temp / "serve_config.yaml"
        path.write_text(yaml.safe_dump(config))
        _run("serve", "run", "--non-blocking", f"--address={self.gcs}", str(path), timeout=240)

    def replicas(self) -> list[int]:
        return _processes(REPLICA)

    def wait_replicas(self, count: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.replicas()) == count and self.ready():
                return
            time.sleep(0.5)
        raise AssertionError(f"{len(self.replicas())} replicas, not {count}")

    def ready(self) -> bool:
        try:
            return bool(httpclient.InferenceServerClient(self.url).is_model_ready("simple"))
        except Exception:
            return False

    def stop(self) -> None:
        subprocess.run(
            ["serve", "shutdown", "-y", f"--address={self.gcs}"], env=ENV, timeout=120,
            check=False, capture_output=True,
        )  # fmt: skip
        subprocess.run(["ray", "stop"], env=ENV, timeout=120, check=False, capture_output=True)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if shutil.which("ray") is None or shutil.which("serve") is None:
        pytest.skip("ray[serve] is not installed (pip install -e .[ray])")
    started = Cluster()
    try:
        yield started
    finally:
        started.stop()
        shutil.rmtree(started.temp, ignore_errors=True)


def _infer(client: httpclient.InferenceServerClient, value: int) -> int:
    data = np.full((1, 16), value, np.int32)
    inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for item in inputs:
        item.set_data_from_numpy(data)
    return int(client.infer("simple", inputs).as_numpy("OUTPUT0")[0, 0])


class Load:
    """tritonclient requests from several threads until stopped; counts what fails."""

    def __init__(self, url: str, threads: int) -> None:
        self.url, self.ok, self.failed, self.errors = url, 0, 0, set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,)) for i in range(threads)]
        for thread in self._threads:
            thread.start()

    def _run(self, index: int) -> None:
        client = httpclient.InferenceServerClient(self.url, network_timeout=30)
        while not self._stop.is_set():
            try:
                assert _infer(client, index) == 2 * index
                with self._lock:
                    self.ok += 1
            except Exception as exc:
                with self._lock:
                    self.failed += 1
                    self.errors.add(str(exc)[:120])
                client = httpclient.InferenceServerClient(self.url, network_timeout=30)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


def test_two_replicas_on_two_nodes_and_one_killed_under_load(cluster: Cluster) -> None:
    repository = example_repository(["simple"])
    cluster.deploy(repository, {"num_replicas": 2, "autoscaling_config": None})
    cluster.wait_replicas(2)
    client = httpclient.InferenceServerClient(cluster.url)
    assert client.is_server_ready()
    assert client.get_model_metadata("simple")["name"] == "simple"
    assert _infer(client, 3) == 6
    load = Load(cluster.url, threads=4)
    time.sleep(2)
    before = load.ok
    victim = cluster.replicas()[0]
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    cluster.wait_replicas(2)
    replaced_s = time.monotonic() - killed_at
    time.sleep(2)
    load.stop()
    report = {"ok": load.ok, "failed": load.failed, "replaced_s": round(replaced_s, 1),
              "errors": sorted(load.errors)}  # fmt: skip
    print("replica killed under load:", json.dumps(report))
    assert before > 0 and load.ok > before  # served before, during and after
    # What Ray's retries did not absorb is counted (printed above); most requests are served.
    assert load.failed <= 0.05 * (load.ok + load.failed), report


def test_perf_analyzer_through_the_proxy(cluster: Cluster) -> None:
    """NVIDIA's load generator against Serve's proxy, unchanged: metadata, config, the
    server-side statistics around each window and the infers all pass through."""
    from tests.test_perf_analyzer import PA_SCRIPT, PA_VENV

    if not (PA_VENV / "bin" / "perf_analyzer").exists():
        pytest.skip(f"perf_analyzer is not installed in {PA_VENV}")
    cluster.deploy(example_repository(["simple"]), {"num_replicas": 1, "autoscaling_config": None})
    cluster.wait_replicas(1)
    windows = ["--measurement-mode", "count_windows", "--measurement-request-count", "50"]
    stable = ["--stability-percentage", "1000", "--max-trials", "10"]  # the protocol, not noise
    result = subprocess.run(
        ["bash", str(PA_SCRIPT), "-m", "simple", "-u", cluster.url, "-i", "http",
         "--concurrency-range", "2", *windows, *stable],
        env={**ENV, "PA_VENV": str(PA_VENV)}, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Throughput:" in result.stdout and "Inference count:" in result.stdout


def test_autoscaling_one_to_two_under_load(cluster: Cluster) -> None:
    repository = example_repository(["simple"])
    autoscaling = {
        "min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 1,
        "upscale_delay_s": 1, "downscale_delay_s": 600, "metrics_interval_s": 0.5,
        "look_back_period_s": 2,
    }  # fmt: skip
    cluster.deploy(repository, {"num_replicas": None, "autoscaling_config": autoscaling})
    cluster.wait_replicas(1)
    load = Load(cluster.url, threads=6)
    try:
        cluster.wait_replicas(2, timeout=90)
    finally:
        load.stop()
    assert load.ok > 0


def test_shutdown_leaves_no_process_or_shared_memory(cluster: Cluster) -> None:
    cluster.stop()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (_processes(str(cluster.temp)) or cluster.replicas()):
        time.sleep(0.5)
    assert not _processes(str(cluster.temp)) and not cluster.replicas()
    assert not _processes("raylet --raylet_socket_name=" + str(cluster.temp))
    # Only our own files count: every ring and one-off file Oceanus makes is named "oceanus-..."
    # (stub_launcher.py, workers/supervisor.py), and on a shared machine other programs (a
    # Triton beside us: triton_python_backend_shm_region_*) come and go in /dev/shm meanwhile.
    left = {n for n in set(os.listdir("/dev/shm")) - cluster.shm_before if n.startswith("oceanus")}
    assert not left, left
