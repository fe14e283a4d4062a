"""The autoscaling signal, checked for real: Debian's Prometheus scrapes a running Oceanus every
two seconds, and the prometheus-adapter rule the chart documents
(deploy/prometheus-adapter-values.yaml, with a 10 s window instead of 30 s) rises under overload
and falls back to 0 at rest. (Every 2 s: a 1 s interval caps the scrape timeout at 1 s, which a
loaded CI machine misses.)"""

from __future__ import annotations

import http.client
import shutil
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from tests.conftest import free_port
from tests.deploy.test_manifests import ROOT, tool

BODY = orjson.dumps(
    {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]}
)
WINDOW = "10s"


def adapter_query() -> str:
    """The adapter's metricsQuery as it would evaluate for all pods, over WINDOW."""
    values = yaml.safe_load((ROOT / "deploy" / "prometheus-adapter-values.yaml").read_text())
    query = str(values["rules"]["custom"][0]["metricsQuery"])
    return (
        query.replace("<<.LabelMatchers>>", 'model="slow_fp32"')
        .replace("<<.GroupBy>>", "job")
        .replace("[30s]", f"[{WINDOW}]")
    )


@pytest.fixture
def prometheus(tmp_path: Path, model_repository: Path, launch: Any) -> Iterator[tuple[Any, int]]:
    binary = tool("prometheus")
    server = launch([model_repository])
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
                "scrape_configs": [
                    {
                        "job_name": "oceanus",
                        "static_configs": [{"targets": [f"127.0.0.1:{server.metrics_port}"]}],
                    }
                ],
            }
        )
    )
    port = free_port()
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield server, port
    finally:
        process.terminate()
        process.wait(30)
        shutil.rmtree(tmp_path / "data", ignore_errors=True)


def query(port: int, expression: str) -> float | None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", "/api/v1/query?query=" + urllib.parse.quote(expression))
        answer = orjson.loads(connection.getresponse().read())
    except OSError:
        return None  # Prometheus still starting
    results = answer.get("data", {}).get("result", [])
    return float(results[0]["value"][1]) if results else None


def wait_for(port: int, expression: str, test: Any, timeout: float) -> float | None:
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = query(port, expression)
        if value is not None and test(value):
            return value
        time.sleep(0.5)
    return value


def test_queue_time_rises_under_overload_and_falls_at_rest(prometheus: tuple[Any, int]) -> None:
    server, port = prometheus
    expression = adapter_query()
    # Scraped, and 0 with no traffic.
    assert wait_for(port, expression, lambda v: v == 0, 60) == 0

    stop = threading.Event()

    def overload() -> None:  # slow_fp32 runs one request at a time: 8 clients queue
        connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
        while not stop.is_set():
            connection.request("POST", "/v2/models/slow_fp32/infer", body=BODY)
            connection.getresponse().read()

    threads = [threading.Thread(target=overload) for _ in range(8)]
    for thread in threads:
        thread.start()
    try:
        # Each request waits behind ~7 others of ~30 ms: well above 10 ms per request.
        loaded = wait_for(port, expression, lambda v: v > 10_000, 60)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert loaded is not None and loaded > 10_000, loaded
    rested = wait_for(port, expression, lambda v: v == 0, 60)
    assert rested == 0, rested
