"""`GET /metrics` on a real server: Triton's families, names, types, HELP texts and values that
agree with `/v2/models/<m>/stats`."""

from __future__ import annotations

import http.client
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from oceanus.examples.small_models import SLOW_STEPS, build_slow

# Triton 2.51's model families: (name, type, HELP), in Triton's order (core src/metrics.cc).
TRITON_MODEL_FAMILIES = [
    (
        "nv_inference_request_success",
        "counter",
        "Number of successful inference requests, all batch sizes",
    ),
    (
        "nv_inference_request_failure",
        "counter",
        "Number of failed inference requests, all batch sizes",
    ),
    (
        "nv_inference_count",
        "counter",
        "Number of inferences performed (does not include cached requests)",
    ),
    (
        "nv_inference_exec_count",
        "counter",
        "Number of model executions performed (does not include cached requests)",
    ),
    (
        "nv_inference_request_duration_us",
        "counter",
        "Cumulative inference request duration in microseconds (includes cached requests)",
    ),
    (
        "nv_inference_queue_duration_us",
        "counter",
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
    ),
    (
        "nv_inference_compute_input_duration_us",
        "counter",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "counter",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_output_duration_us",
        "counter",
        "Cumulative inference compute output duration in microseconds (does not include cached "
        "requests)",
    ),
    (
        "nv_inference_pending_request_count",
        "gauge",
        "Instantaneous number of pending requests awaiting execution per-model.",
    ),
    ("nv_model_load_duration_secs", "gauge", "Model load time in seconds"),
]
CPU_FAMILIES = ["nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes"]
GPU_FAMILIES = [
    "nv_gpu_utilization",
    "nv_gpu_memory_total_bytes",
    "nv_gpu_memory_used_bytes",
    "nv_gpu_power_usage",
    "nv_gpu_power_limit",
    "nv_energy_consumption",
]
REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


def scrape_text(server: Any, path: str = "/metrics") -> str:
    connection = http.client.HTTPConnection("127.0.0.1", server.metrics_port, timeout=10)
    connection.request("GET", path)
    response = connection.getresponse()
    assert response.status == 200
    return response.read().decode()


class Scrape:
    """One parsed scrape: families by name, sample values by (sample name, labels)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        self.values: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for family in self.families.values():
            for sample in family.samples:
                name = sample.name
                # the parser gives counters OpenMetrics' `_total`; Triton's names have none
                if family.type == "counter" and name == family.name + "_total":
                    name = family.name
                self.values[(name, frozenset(sample.labels.items()))] = sample.value

    def value(self, name: str, **labels: str) -> float:
        return self.values[(name, frozenset(labels.items()))]

    def model(self, name: str, model: str, version: str = "1", **labels: str) -> float:
        return self.value(name, model=model, version=version, **labels)


def scrape(server: Any) -> Scrape:
    return Scrape(scrape_text(server))


def _has_nvidia_gpu() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetCount()) > 0
    except Exception:
        return False


def simple_inputs(batch: int) -> list[httpclient.InferInput]:
    data = np.arange(16 * batch, dtype=np.int32).reshape(batch, 16)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [batch, 16], "INT32")
        tensor.set_data_from_numpy(data, binary_data=True)
        inputs.append(tensor)
    return inputs


def slow_input(rows: int = 1) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("INPUT0", [rows, 16], "FP32")
    tensor.set_data_from_numpy(np.ones((rows, 16), dtype=np.float32), binary_data=True)
    return [tensor]


@pytest.fixture(scope="module")
def metrics_server(launch_module: Any, model_repository: Path) -> Any:
    return launch_module([model_repository])


def test_counters_match_the_statistics_extension(metrics_server: Any) -> None:
    client = httpclient.InferenceServerClient(metrics_server.http_url)
    for _ in range(3):
        client.infer("simple", simple_inputs(1))
    client.infer("simple", simple_inputs(2))
    with pytest.raises(
        InferenceServerException
    ):  # refused in validation: counted nowhere, as in Triton
        client.infer("simple", simple_inputs(9))
    stats = client.get_inference_statistics("simple")["model_stats"][0]
    got = scrape(metrics_server)
    inference = stats["inference_stats"]

    assert got.model("nv_inference_request_success", "simple") == inference["success"]["count"] == 4
    assert got.model("nv_inference_count", "simple") == stats["inference_count"] == 5
    assert got.model("nv_inference_exec_count", "simple") == stats["execution_count"] == 4
    for family, key in [
        ("nv_inference_request_duration_us", "success"),
        ("nv_inference_queue_duration_us", "queue"),
        ("nv_inference_compute_input_duration_us", "compute_input"),
        ("nv_inference_compute_infer_duration_us", "compute_infer"),
        ("nv_inference_compute_output_duration_us", "compute_output"),
    ]:
        assert got.model(family, "simple") == inference[key]["ns"] // 1000, family
    for reason in REASONS:
        assert got.model("nv_inference_request_failure", "simple", reason=reason) == 0
    assert got.model("nv_inference_pending_request_count", "simple") == 0
    assert got.model("nv_model_load_duration_secs", "simple") > 0


def test_families_have_tritons_names_types_and_help(metrics_server: Any) -> None:
    text = scrape_text(metrics_server)
    got = Scrape(text)
    lines = text.splitlines()
    positions = []
    for name, typ, help_text in TRITON_MODEL_FAMILIES:
        assert f"# HELP {name} {help_text}" in lines, name
        assert f"# TYPE {name} {typ}" in lines, name
        positions.append(lines.index(f"# HELP {name} {help_text}"))
    assert positions == sorted(positions)
    # counters keep Triton's names: no OpenMetrics `_total` suffix on the wire
    assert not any("_total{" in line for line in lines)
    assert 'nv_inference_request_success{model="simple",version="1"} ' in text
    # every model version has all four failure reasons from the start
    for model in ("simple", "simple_dyna", "slow_fp32", "identity_fp32"):
        for reason in REASONS:
            assert got.model("nv_inference_request_failure", model, reason=reason) == 0
    # summaries and histograms are off by default, as in Triton
    assert "nv_inference_request_summary_us" not in got.families
    assert "nv_inference_first_response_histogram_ms" not in got.families


def test_machine_gauges(metrics_server: Any) -> None:
    got = scrape(metrics_server)
    for name in CPU_FAMILIES:
        assert got.families[name].type == "gauge"
    assert 0.0 <= got.value("nv_cpu_utilization") <= 1.0
    total = got.value("nv_cpu_memory_total_bytes")
    assert 0 < got.value("nv_cpu_memory_used_bytes") <= total
    if not _has_nvidia_gpu():
        # without a GPU the families are absent, not zero
        for name in GPU_FAMILIES:
            assert name not in got.families
            assert name not in got.text


def test_other_paths_and_methods_answer_as_triton(metrics_server: Any) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", metrics_server.metrics_port, timeout=5)
    connection.request("GET", "/other")
    response = connection.getresponse()
    assert (response.status, response.read()) == (200, b"")
    connection.request("POST", "/metrics", body=b"")
    response = connection.getresponse()
    assert response.status == 405
    assert response.read() == b'{"error":"Method Not Allowed"}'


def test_pending_count_rises_while_a_slow_model_is_busy(metrics_server: Any) -> None:
    client = httpclient.InferenceServerClient(metrics_server.http_url, concurrency=8)
    before = scrape(metrics_server).model("nv_inference_request_success", "slow_fp32")
    requests = [client.async_infer("slow_fp32", slow_input()) for _ in range(8)]
    highest = 0.0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        got = scrape(metrics_server)
        highest = max(highest, got.model("nv_inference_pending_request_count", "slow_fp32"))
        if got.model("nv_inference_request_success", "slow_fp32") - before >= 8:
            break
        time.sleep(0.01)
    for request in requests:
        request.get_result()
    assert highest >= 2
    got = scrape(metrics_server)
    assert got.model("nv_inference_pending_request_count", "slow_fp32") == 0
    assert got.model("nv_inference_request_success", "slow_fp32") == before + 8


# ---- a repository with queue policies: failure reasons --------------------------------------

QUEUE_CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 1
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
metric_tags {{ key: "team" value: "search" }}
dynamic_batching {{
  default_queue_policy {{
    timeout_action: REJECT
    default_timeout_microseconds: 1000
    max_queue_size: 1
  }}
}}
"""


@pytest.fixture(scope="module")
def queue_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("metrics-repo")
    model = root / "slow_queue" / "1"
    model.mkdir(parents=True)
    # ~10x slow_fp32, so the second request surely waits behind the first on a loaded machine
    onnx.save(build_slow(steps=10 * SLOW_STEPS), str(model / "model.onnx"))
    (root / "slow_queue" / "config.pbtxt").write_text(QUEUE_CONFIG.format(name="slow_queue"))
    return root


def test_queue_timeout_is_rejected_and_queue_full_is_not_counted(
    launch: Any, queue_repository: Path
) -> None:
    server = launch(
        [queue_repository],
        [
            "--allow-cpu-metrics=false",
            "--metrics-config",
            "summary_latencies=true",
            "--metrics-config",
            "histogram_latencies=true",
        ],
    )
    client = httpclient.InferenceServerClient(server.http_url, concurrency=4)
    pending = []
    for _ in range(4):  # 1 runs, 1 waits and times out, 2 find the queue full
        pending.append(client.async_infer("slow_queue", slow_input()))
        time.sleep(0.05)
    results: list[Any] = []
    for request in pending:
        try:
            results.append(request.get_result())
        except InferenceServerException as exc:
            results.append(exc)
    errors = sorted(str(r) for r in results if isinstance(r, Exception))
    # Usually 1 runs, 1 times out and 2 find the queue full; on a fast or a loaded machine the
    # split can differ, so the counts below follow what actually happened.
    timeouts = sum("Request timeout expired" in e for e in errors)
    successes = len(results) - len(errors)
    assert timeouts >= 1, errors
    assert all("Exceeds maximum queue size" in e or "Request timeout expired" in e for e in errors)

    stats = client.get_inference_statistics("slow_queue")["model_stats"][0]["inference_stats"]
    labels = {"model": "slow_queue", "version": "1", "_team": "search"}
    got = scrape(server)
    assert (
        stats["success"]["count"]
        == got.value("nv_inference_request_success", **labels)
        == successes
    )
    # Triton: the timeout is a failure (REJECTED); queue-full refusals are counted nowhere
    assert stats["fail"]["count"] == timeouts
    assert got.value("nv_inference_request_failure", reason="REJECTED", **labels) == timeouts
    for reason in ("CANCELED", "BACKEND", "OTHER"):
        assert got.value("nv_inference_request_failure", reason=reason, **labels) == 0

    # --metrics-config families: summaries' _count/_sum are the statistics' own numbers
    assert got.families["nv_inference_queue_summary_us"].type == "summary"
    assert got.value("nv_inference_queue_summary_us_count", **labels) == stats["queue"]["count"]
    assert got.value("nv_inference_queue_summary_us_sum", **labels) == stats["queue"]["ns"] // 1000
    request_us = stats["success"]["ns"] / 1000
    p50 = got.value("nv_inference_request_summary_us", quantile="0.5", **labels)
    if successes == 1:  # the usual split: the median is the one observation (2% quantile error)
        assert abs(p50 - request_us) <= 0.02 * request_us + 1
    else:  # the median is one of the observations, so at most their sum
        assert 0 < p50 <= request_us * 1.02 + 1
    assert got.families["nv_inference_first_response_histogram_ms"].type == "histogram"
    assert (
        got.value("nv_inference_first_response_histogram_ms_bucket", le="+Inf", **labels)
        == successes
    )
    # --allow-cpu-metrics=false
    assert "nv_cpu_utilization" not in got.families


def test_allow_metrics_false_serves_no_metrics(launch: Any, queue_repository: Path) -> None:
    server = launch([queue_repository], ["--allow-metrics=false"])
    connection = http.client.HTTPConnection("127.0.0.1", server.metrics_port, timeout=2)
    with pytest.raises(OSError):
        connection.request("GET", "/metrics")
        connection.getresponse()


def test_client_disconnect_while_queued_is_canceled(metrics_server: Any) -> None:
    client = httpclient.InferenceServerClient(metrics_server.http_url, concurrency=2)
    before = scrape(metrics_server)
    busy = client.async_infer("slow_fp32", slow_input())
    time.sleep(0.005)
    body = (
        b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,16],"data":'
        + str([1.0] * 16).encode()
        + b"}]}"
    )
    with socket.create_connection(("127.0.0.1", metrics_server.http_port)) as sock:
        sock.sendall(
            b"POST /v2/models/slow_fp32/infer HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        )
        time.sleep(0.01)  # queued behind the busy request, then the client goes away
    busy.get_result()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        got = scrape(metrics_server)
        canceled = got.model("nv_inference_request_failure", "slow_fp32", reason="CANCELED")
        if canceled > before.model("nv_inference_request_failure", "slow_fp32", reason="CANCELED"):
            break
        time.sleep(0.05)
    assert (
        canceled == before.model("nv_inference_request_failure", "slow_fp32", reason="CANCELED") + 1
    )
    stats = client.get_inference_statistics("slow_fp32")["model_stats"][0]["inference_stats"]
    failures = sum(
        got.model("nv_inference_request_failure", "slow_fp32", reason=r) for r in REASONS
    )
    assert stats["fail"]["count"] == failures
