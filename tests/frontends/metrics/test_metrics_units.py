"""In-process checks: the collector over real ModelStatistics, the text format, --metrics-config,
the latency distributions, /proc parsing and the logging extension's handler."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.cli import parse_args
from oceanus.core.model import ModelState, ModelVersion
from oceanus.core.observability import statistics
from oceanus.core.observability.latency import LatencyOptions, LatencyRecorder, WindowedQuantiles
from oceanus.frontends.http.extensions import handle_logging
from oceanus.frontends.metrics import MetricsConfig, TritonCollector, parse_metrics_config
from oceanus.frontends.metrics.exposition import format_value, render
from oceanus.frontends.metrics.server import enable_latency_recording
from oceanus.frontends.metrics.system import SystemMetrics, read_cpu_times, read_memory
from oceanus.logs import LogSettings


class FakeEntry:
    def __init__(self, versions: dict[int, ModelVersion]) -> None:
        self.versions = versions


class FakeCore:
    def __init__(self, *versions: ModelVersion) -> None:
        self.models = {v.name: FakeEntry({v.version: v}) for v in versions}

    def ready_versions(self) -> list[ModelVersion]:
        """Ready versions by name (ServerCore.ready_versions)."""
        return [
            v
            for _, entry in sorted(self.models.items())
            for v in entry.versions.values()
            if v.ready
        ]

    def cache_enabled(self, model: ModelVersion) -> bool:
        """No response cache (ServerCore.cache_enabled)."""
        return False


def version(name: str, tags: dict[str, str] | None = None) -> ModelVersion:
    config = mc.ModelConfig(name=name, max_batch_size=8)
    for key, value in (tags or {}).items():
        config.metric_tags[key] = value
    model = ModelVersion(name, 1, config, Path("/nonexistent"))
    model.state = ModelState.READY
    model.load_duration_s = 0.25
    return model


def render_core(core: object, config: MetricsConfig | None = None) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TritonCollector(core, config))  # type: ignore[arg-type]
    return render(registry.collect()).decode()


def values(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = family.name if family.type == "counter" else sample.name
            out[(name, frozenset(sample.labels.items()))] = sample.value
    return out


def test_collector_reads_statistics_at_scrape_time() -> None:
    model = version("m", {"team": "search"})
    core = FakeCore(model, version("unready"))
    core.models["unready"].versions[1].state = ModelState.UNAVAILABLE
    model.stats.record_success(2_500_000, 1_000, 2_000, 2_400_000, 3_999, rows=3)
    model.stats.record_execution(3, 2_000, 2_400_000, 3_999)
    model.stats.record_failure(10_000, "BACKEND")
    model.stats.record_failure(10_000, "OTHER")
    model.stats.record_failure(10_000, "OTHER")
    text = render_core(core)
    got = values(text)
    labels = {("model", "m"), ("version", "1"), ("_team", "search")}

    def value(name: str, **extra: str) -> float:
        return got[(name, frozenset(labels | set(extra.items())))]

    assert value("nv_inference_request_success") == 1
    assert value("nv_inference_count") == 3
    assert value("nv_inference_exec_count") == 1
    assert value("nv_inference_request_duration_us") == 2500
    assert value("nv_inference_queue_duration_us") == 1
    assert value("nv_inference_compute_input_duration_us") == 2
    assert value("nv_inference_compute_infer_duration_us") == 2400
    assert value("nv_inference_compute_output_duration_us") == 3
    assert value("nv_inference_request_failure", reason="BACKEND") == 1
    assert value("nv_inference_request_failure", reason="OTHER") == 2
    assert value("nv_inference_request_failure", reason="REJECTED") == 0
    assert value("nv_inference_pending_request_count") == 0
    assert value("nv_model_load_duration_secs") == 0.25
    assert "unready" not in text  # only loaded versions, as Triton removes unloaded reporters
    # labels sorted by name as prometheus-cpp writes them
    assert (
        'nv_inference_request_failure{_team="search",model="m",reason="BACKEND",version="1"} 1'
        in text
    )
    # read at scrape time: a new request shows in the next scrape, nothing is cached
    model.stats.record_success(1_000_000, 0, 0, 0, 0, rows=1)
    assert values(render_core(core))[("nv_inference_request_success", frozenset(labels))] == 2


def test_counter_latencies_false_drops_only_the_duration_counters() -> None:
    text = render_core(FakeCore(version("m")), parse_metrics_config({"counter_latencies": "false"}))
    assert "nv_inference_request_duration_us" not in text
    assert "nv_inference_compute_infer_duration_us" not in text
    assert "nv_inference_request_success" in text
    assert "nv_inference_pending_request_count" in text


def test_no_models_no_model_families() -> None:
    assert render_core(FakeCore()) == ""


def test_format_value_matches_prometheus_cpp() -> None:
    assert format_value(36.0) == "36"
    assert format_value(0.25) == "0.25"
    assert format_value(math.nan) == "NaN"
    assert format_value(math.inf) == "+Inf"


def test_metrics_config_parsing() -> None:
    config = parse_metrics_config(
        {
            "summary_latencies": "true",
            "histogram_latencies": "true",
            "counter_latencies": "false",
            "summary_quantiles": "0.5:0.05,0.99:0.001",
        }
    )
    assert config.summary_latencies and config.histogram_latencies
    assert not config.counter_latencies
    assert config.summary_quantiles == ((0.5, 0.05), (0.99, 0.001))
    # only the literal "true" enables a family, as in Triton
    assert not parse_metrics_config({"summary_latencies": "1"}).summary_latencies
    # a bad quantile list keeps the defaults
    assert parse_metrics_config({"summary_quantiles": "0.5"}).summary_quantiles == (
        MetricsConfig().summary_quantiles
    )


def test_cli_metrics_flags() -> None:
    settings, ignored = parse_args(
        ["--metrics-config", "summary_latencies=true", "--metrics-config=counter_latencies=false"]
    )
    assert settings.metrics_config == {
        "summary_latencies": "true",
        "counter_latencies": "false",
    }
    assert "--metrics-config" not in ignored
    # Triton: the metrics address follows --http-address unless given
    assert parse_args(["--http-address=127.0.0.1"])[0].metrics_address == "127.0.0.1"
    assert (
        parse_args(["--http-address=127.0.0.1", "--allow-http=false"])[0].metrics_address
        == "0.0.0.0"
    )
    assert parse_args(["--metrics-address=10.0.0.1"])[0].metrics_address == "10.0.0.1"
    with pytest.raises(SystemExit):
        parse_args(["--metrics-config", "summary_latencies"])


def test_windowed_quantiles() -> None:
    window = WindowedQuantiles(max_age_s=60, age_buckets=5)
    assert all(math.isnan(v) for v in window.quantiles([0.5]))
    now = 0.0
    window._rotate_at = 12.0
    for value in range(1, 1001):
        window.observe(value, now)
    p50, p99 = window.quantiles([0.5, 0.99], now)
    assert abs(p50 - 500) <= 10
    assert abs(p99 - 990) <= 15
    # observations older than the window are forgotten
    assert all(math.isnan(v) for v in window.quantiles([0.5], now + 61))


def test_latency_recorder_is_attached_to_new_statistics() -> None:
    enable_latency_recording(parse_metrics_config({"histogram_latencies": "true"}))
    try:
        stats = statistics.ModelStatistics()
        assert stats.latency is not None and stats.latency.first_response is not None
        assert stats.latency.summaries is None
        stats.record_success(150_000_000, 0, 0, 0, 0, rows=1)
        stats.record_success(50_000_000, 0, 0, 0, 0, rows=1)
        assert stats.latency.first_response.cumulative() == [
            (100.0, 1),
            (500.0, 2),
            (2000.0, 2),
            (5000.0, 2),
            (math.inf, 2),
        ]
    finally:
        enable_latency_recording(MetricsConfig())
    assert statistics.ModelStatistics().latency is None


def test_latency_recorder_summaries() -> None:
    recorder = LatencyRecorder(LatencyOptions(summaries=True))
    recorder.observe(2_000_000, 1_000_000, 0, 900_000, 100_000)
    assert recorder.summaries is not None
    assert recorder.summaries["request"].quantiles([0.5]) == [pytest.approx(2000, rel=0.01)]
    assert recorder.summaries["compute_input"].quantiles([0.5]) == [0.0]


def test_proc_parsing(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3\n")
    assert read_cpu_times(str(stat)) == (150, 1000)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 1000 kB\nMemFree: 10 kB\nMemAvailable: 400 kB\n")
    assert read_memory(str(meminfo)) == (1024000, 600 * 1024)
    assert read_memory(str(tmp_path / "missing")) is None


def test_system_metrics_poll_without_gpu_flag() -> None:
    system = SystemMetrics(interval_ms=50, cpu=True, gpu=False)
    snapshot = system.poll()
    assert snapshot.gpus == ()
    assert snapshot.cpu_memory_total_bytes and snapshot.cpu_memory_total_bytes > 0
    system.stop()


# ---- logging extension ----------------------------------------------------------------------


def test_logging_get_and_post_change_loggers_at_run_time() -> None:
    settings = LogSettings()
    status, document = handle_logging(settings, "GET", b"")
    assert status == 200
    assert document == {
        "log_file": "",
        "log_info": True,
        "log_warning": True,
        "log_error": True,
        "log_verbose_level": 0,
        "log_format": "default",
    }
    assert list(document) == [
        "log_file",
        "log_info",
        "log_warning",
        "log_error",
        "log_verbose_level",
        "log_format",
    ]
    try:
        status, document = handle_logging(
            settings, "POST", orjson.dumps({"log_info": False, "log_format": "ISO8601"})
        )
        assert status == 200
        assert document["log_info"] is False and document["log_format"] == "ISO8601"
        assert document["log_warning"] is True  # unspecified settings stay
        assert logging.getLogger("oceanus").level == logging.WARNING
        status, document = handle_logging(settings, "POST", b'{"log_verbose_level": 1}')
        assert (status, document["log_verbose_level"]) == (200, 1)
        assert logging.getLogger("oceanus").level == logging.DEBUG
        assert handle_logging(settings, "POST", b"")[0] == 200  # empty body: just read
    finally:
        handle_logging(
            settings,
            "POST",
            b'{"log_info": true, "log_verbose_level": 0, "log_format": "default"}',
        )


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b'{"log_file": "/tmp/x.log"}', 501, "log file location can not be updated"),
        (b'{"log_info": "yes"}', 400, "non-boolean"),
        (b'{"log_verbose_level": -1}', 400, "non-unsigned-integer"),
        (b'{"log_format": "json"}', 400, "invalid argument for --log_format, got: json"),
        (b"{not json", 400, "failed to parse"),
    ],
)
def test_logging_errors_change_nothing(body: bytes, status: int, message: str) -> None:
    settings = LogSettings()
    got_status, document = handle_logging(settings, "POST", b'{"log_error": false,' + body[1:])
    if body.startswith(b"{not"):
        got_status, document = handle_logging(settings, "POST", body)
    assert got_status == status
    assert message in document["error"]
    assert settings == LogSettings()


def test_logging_wrong_method() -> None:
    assert handle_logging(LogSettings(), "DELETE", b"") == (405, {"error": "Method Not Allowed"})
