"""In-process checks of the status page's pieces: /proc parsing, the connection count, the
recent latency window and the status document built from real ModelStatistics."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from oceanus.core.model import ModelState, ModelVersion
from oceanus.core.observability.custom_metrics import CustomMetricRegistry
from oceanus.core.observability.statistics import ModelStatistics
from oceanus.frontends.metrics.page import ASSETS, load_assets
from oceanus.frontends.metrics.process import (
    ProcessSampler,
    count_connections,
    descendants,
    read_stat,
)
from oceanus.frontends.metrics.status import models

LINUX = Path("/proc/self/stat").exists()


def test_read_stat_handles_spaces_and_parentheses_in_the_name(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    # state, ppid, 9 more, utime (14), stime (15), 8 more, rss (24)
    fields = ["S", "1", *["0"] * 9, "150", "50", *["0"] * 8, "321"]
    (tmp_path / "42" / "stat").write_text("42 (a (weird) name) " + " ".join(fields) + " 0 0\n")
    assert read_stat(42, tmp_path) == (200, 321)
    assert read_stat(43, tmp_path) is None


def test_count_connections_counts_established_sockets_on_served_ports(tmp_path: Path) -> None:
    table = tmp_path / "tcp"
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt\n"
    rows = [
        "0: 0100007F:1F40 00000000:0000 0A 0 0",  # 8000 listening: not a connection
        "1: 0100007F:1F40 0100007F:C350 01 0 0",  # 8000 established
        "2: 0100007F:1F40 0100007F:C351 01 0 0",
        "3: 0100007F:1F41 0100007F:C352 01 0 0",  # 8001 established
        "4: 0100007F:C350 0100007F:1F40 01 0 0",  # the client's end: local port is not ours
        "5: 0100007F:1F40 0100007F:C353 06 0 0",  # TIME_WAIT
    ]
    table.write_text(header + "\n".join(rows) + "\n")
    counts = count_connections({8000: "http", 8001: "grpc"}, [table])
    assert counts == {"http": 2, "grpc": 1}
    assert count_connections({8000: "http"}, [tmp_path / "missing"]) is None


def test_count_connections_sees_a_real_socket() -> None:
    if not LINUX:
        return
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        before = count_connections({port: "http"})
        with socket.create_connection(("127.0.0.1", port)):
            accepted, _ = listener.accept()
            assert count_connections({port: "http"}) == {"http": 1}
            accepted.close()
        assert before == {"http": 0}


def test_process_sampler_covers_children() -> None:
    if not LINUX:
        return
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in descendants(os.getpid())
        sampler = ProcessSampler(min_interval_s=0.0)
        first = sampler.sample()
        assert first.processes >= 2 and first.rss_bytes > 0 and first.cpu_seconds > 0
        assert sampler.cpu_percent() is None  # one reading: no rate yet
        sum(range(200_000))
        sampler.sample()
        percent = sampler.cpu_percent()
        assert percent is not None and percent >= 0.0
    finally:
        child.kill()
        child.wait()


def test_process_sampler_reads_once_per_interval() -> None:
    sampler = ProcessSampler(min_interval_s=60.0)
    assert sampler.sample() is sampler.sample()


def test_recent_window_starts_when_watched() -> None:
    stats = ModelStatistics()
    stats.record_success(1_000_000, 0, 0, 0, 0, 1)
    assert stats.latency is None  # nobody watched: nothing kept
    window = stats.watch_recent(10.0)
    assert stats.watch_recent(10.0) is window
    for request_us in (100, 200, 300, 400, 10_000):
        stats.record_success(request_us * 1000, 0, 0, 0, 0, 1)
    p50, p99 = window.quantiles((0.5, 0.99))
    assert abs(p50 - 300) <= 3 and abs(p99 - 10_000) <= 100


class FakeEntry:
    def __init__(self, name: str, versions: dict[int, ModelVersion], error: str = "") -> None:
        self.name = name
        self.versions = versions
        self.error = error


class Core:
    """What `status.models` reads of the ServerCore: the model entries, the cache and the
    custom metrics (a language model's figures)."""

    def __init__(self, *entries: FakeEntry, cached: str = "") -> None:
        self.models = {e.name: e for e in entries}
        self.cached = cached
        self.custom_metrics = CustomMetricRegistry()

    def cache_enabled(self, model: ModelVersion) -> bool:
        return model.name == self.cached


def ready_version(name: str, **fields: Any) -> ModelVersion:
    config = mc.ModelConfig(name=name, backend="onnxruntime", **fields)
    config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_CPU, count=2)
    version = ModelVersion(name, 1, config, Path("unused"))
    version.state = ModelState.READY
    return version


def test_models_document_reads_the_statistics() -> None:
    busy = ready_version("busy", max_batch_size=8)
    busy.config.dynamic_batching.SetInParent()
    stats = busy.stats
    stats.record_execution(4, 10, 20, 30)
    stats.record_execution(1, 1, 2, 3)
    for _ in range(5):
        stats.record_success(5000, 1000, 100, 2000, 100, 1)
    stats.record_failure(7000, "REJECTED")
    stats.record_cache_hit(900, 100, 50)
    core = Core(FakeEntry("busy", {1: busy}), FakeEntry("broken", {}, "no model file"))
    core.cached = "busy"
    folders = {"never_loaded", "busy", "broken"}
    document = {m["name"]: m for m in models(core, folders)}  # type: ignore[arg-type]
    assert document["never_loaded"]["state"] == "UNLOADED"
    assert document["broken"] == {
        "key": "broken",
        "name": "broken",
        "version": "",
        "state": "UNAVAILABLE",
        "reason": "no model file",
    }
    item = document["busy"]
    assert item["key"] == "busy" and item["version"] == "1"
    assert item["backend"] == "onnxruntime" and item["dynamic_batching"] is True
    assert item["instances"] == [{"kind": "KIND_CPU", "count": 2}]
    got = item["stats"]
    assert (got["success"], got["fail"], got["execution_count"]) == (6, 1, 2)
    assert got["batches"] == {"1": 1, "4": 1}
    assert got["failures"]["REJECTED"] == 1
    assert got["cache"] == {"hits": 1, "misses": 0}
    assert got["ns"]["queue"] == 5 * 1000 + 100
    # the window started with this document: nothing in it yet
    assert got["latency"]["p50_us"] is None
    assert got["llm"] is None  # not a language model


def test_assets_ship_with_the_package() -> None:
    assets = load_assets()
    assert set(assets) == set(ASSETS)
    assert b"status.js" in assets["/"].body
    # nothing from elsewhere: no URL with a scheme in the page's own files
    for reply in assets.values():
        assert b"http://" not in reply.body.replace(b"http://www.w3.org/2000/svg", b"")
        assert b"https://" not in reply.body
