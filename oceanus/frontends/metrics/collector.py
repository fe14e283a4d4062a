"""A prometheus_client Collector that reads the core's statistics at scrape time.

Nothing here counts: every number is read from `ModelStatistics` (the same objects that answer
`/v2/models/stats`), the scheduler's pending count, the load duration, or the latest machine
snapshot, when Prometheus scrapes. Names, types and HELP texts are Triton 2.51's
(core src/metrics.cc); labels are `model`, `version`, one `_<key>` per `metric_tags` entry of the
model's config, and `reason` on failures.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Protocol

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from oceanus.core.model import ModelVersion
from oceanus.core.observability.custom_metrics import HISTOGRAM, FamilySnapshot
from oceanus.core.observability.latency import SUMMARY_KINDS
from oceanus.core.observability.statistics import FAILURE_REASONS, Duration, ModelStatistics
from oceanus.core.server import ServerCore
from oceanus.frontends.metrics.config import MetricsConfig
from oceanus.frontends.metrics.system import SystemMetrics
from oceanus.ipc import budget


class CustomFamilies(Protocol):
    """Where custom metric families come from (the core's CustomMetricRegistry)."""

    def snapshot(self) -> list[FamilySnapshot]: ...


_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

# (name, HELP) of the per model version families, in Triton's order.
SUCCESS = (
    "nv_inference_request_success",
    "Number of successful inference requests, all batch sizes",
)
FAILURE = ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes")
COUNT = ("nv_inference_count", "Number of inferences performed (does not include cached requests)")
EXEC_COUNT = (
    "nv_inference_exec_count",
    "Number of model executions performed (does not include cached requests)",
)
LATENCY_COUNTERS = (
    (
        "nv_inference_request_duration_us",
        "Cumulative inference request duration in microseconds (includes cached requests)",
        "success",
    ),
    (
        "nv_inference_queue_duration_us",
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
        "queue",
    ),
    (
        "nv_inference_compute_input_duration_us",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
        "compute_input",
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
        "compute_infer",
    ),
    (
        "nv_inference_compute_output_duration_us",
        "Cumulative inference compute output duration in microseconds (does not include cached "
        "requests)",
        "compute_output",
    ),
)
PENDING = (
    "nv_inference_pending_request_count",
    "Instantaneous number of pending requests awaiting execution per-model.",
)
LOAD_TIME = ("nv_model_load_duration_secs", "Model load time in seconds")
FIRST_RESPONSE = (
    "nv_inference_first_response_histogram_ms",
    "Duration from request to first response in milliseconds",
)
# Per model version families of the response cache, only for versions that use it (Triton's
# MetricModelReporter adds them when the model's cache is enabled): (name, HELP, stats field).
CACHE_COUNTERS = (
    ("nv_cache_num_hits_per_model", "Number of cache hits per model", "cache_hit", False),
    (
        "nv_cache_hit_duration_per_model",
        "Total cache hit duration per model, in microseconds",
        "cache_hit",
        True,
    ),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model", "cache_miss", False),
    (
        "nv_cache_miss_duration_per_model",
        "Total cache miss (insert+lookup) duration per model, in microseconds",
        "cache_miss",
        True,
    ),
)
# kind (as in latency.SUMMARY_KINDS) -> (name, HELP, statistics field for _count/_sum)
SUMMARIES = {
    "request": (
        "nv_inference_request_summary_us",
        "Summary of inference request duration in microseconds (includes cached requests)",
        "success",
    ),
    "queue": (
        "nv_inference_queue_summary_us",
        "Summary of inference queuing duration in microseconds (includes cached requests)",
        "queue",
    ),
    "compute_input": (
        "nv_inference_compute_input_summary_us",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
        "compute_input",
    ),
    "compute_infer": (
        "nv_inference_compute_infer_summary_us",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
        "compute_infer",
    ),
    "compute_output": (
        "nv_inference_compute_output_summary_us",
        "Cumulative inference compute output duration in microseconds (does not include cached "
        "requests)",
        "compute_output",
    ),
}
GPU_FAMILIES = (
    ("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", "gauge", "utilization"),
    ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", "gauge", "memory_total_bytes"),
    ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", "gauge", "memory_used_bytes"),
    ("nv_gpu_power_usage", "GPU power usage in watts", "gauge", "power_usage_w"),
    ("nv_gpu_power_limit", "GPU power management limit in watts", "gauge", "power_limit_w"),
    (
        "nv_energy_consumption",
        "GPU energy consumption in joules since the Triton Server started",
        "counter",
        "energy_j",
    ),
)
CPU_FAMILIES = (
    ("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", "cpu_utilization"),
    ("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", "cpu_memory_total_bytes"),
    ("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", "cpu_memory_used_bytes"),
)


def _labels(version: ModelVersion) -> dict[str, str]:
    labels = {"model": version.name, "version": version.version_str}
    for key, value in version.config.metric_tags.items():
        name = "_" + key
        if _LABEL_NAME.match(name):
            labels[name] = value
    return dict(sorted(labels.items()))


def _us(duration: Duration) -> int:
    return duration.ns // 1000


class TritonCollector(Collector):
    def __init__(
        self,
        core: ServerCore,
        config: MetricsConfig | None = None,
        system: SystemMetrics | None = None,
        custom: CustomFamilies | None = None,
    ) -> None:
        self.core = core
        self.config = config or MetricsConfig()
        self.system = system
        self.custom = custom

    def _versions(self) -> list[tuple[ModelVersion, dict[str, str]]]:
        return [(version, _labels(version)) for version in self.core.ready_versions()]

    def collect(self) -> Iterator[Metric]:
        versions = self._versions()
        if versions:
            yield from self._model_families(versions)
        if self.system is not None:  # machine readings (--allow-cpu-metrics)
            yield from self._system_families()
            yield from _shm_families()
        if self.custom is not None:
            yield from _custom_families(self.custom.snapshot())

    def _model_families(
        self, versions: list[tuple[ModelVersion, dict[str, str]]]
    ) -> Iterator[Metric]:
        def family(spec: tuple[str, str], typ: str, value_of: object) -> Metric:
            name, help_text = spec
            metric = Metric(name, help_text, typ)
            for version, labels in versions:
                metric.add_sample(name, labels, float(value_of(version)))  # type: ignore[operator]
            return metric

        yield family(SUCCESS, "counter", lambda v: v.stats.success.count)
        failure = Metric(*FAILURE, "counter")
        for version, labels in versions:
            for reason in FAILURE_REASONS:
                reason_labels = dict(sorted({**labels, "reason": reason}.items()))
                count = version.stats.failures_by_reason.get(reason, 0)
                failure.add_sample(FAILURE[0], reason_labels, float(count))
        yield failure
        yield family(COUNT, "counter", lambda v: v.stats.inference_count)
        yield family(EXEC_COUNT, "counter", lambda v: v.stats.execution_count)
        if self.config.counter_latencies:
            for name, help_text, field_name in LATENCY_COUNTERS:
                yield family(
                    (name, help_text),
                    "counter",
                    lambda v, f=field_name: _us(getattr(v.stats, f)),
                )
        yield family(
            PENDING,
            "gauge",
            lambda v: v.pending_count,
        )
        yield family(LOAD_TIME, "gauge", lambda v: v.load_duration_s)
        cached = [(v, labels) for v, labels in versions if self.core.cache_enabled(v)]
        if cached:
            for name, help_text, field_name, duration in CACHE_COUNTERS:
                metric = Metric(name, help_text, "counter")
                for version, labels in cached:
                    value: Duration = getattr(version.stats, field_name)
                    number = _us(value) if duration else value.count
                    metric.add_sample(name, labels, float(number))
                yield metric
        if self.config.histogram_latencies:
            yield self._histogram(versions)
        if self.config.summary_latencies:
            yield from self._summaries(versions)

    def _histogram(self, versions: list[tuple[ModelVersion, dict[str, str]]]) -> Metric:
        name, help_text = FIRST_RESPONSE
        metric = Metric(name, help_text, "histogram")
        for version, labels in versions:
            latency = version.stats.latency
            histogram = latency.first_response if latency is not None else None
            if histogram is None:
                continue
            buckets = histogram.cumulative()
            metric.add_sample(name + "_count", labels, float(buckets[-1][1]))
            metric.add_sample(name + "_sum", labels, histogram.sum)
            for bound, count in buckets:
                le = "+Inf" if math.isinf(bound) else _bound(bound)
                metric.add_sample(name + "_bucket", {**labels, "le": le}, float(count))
        return metric

    def _summaries(self, versions: list[tuple[ModelVersion, dict[str, str]]]) -> Iterator[Metric]:
        wanted = [q for q, _ in self.config.summary_quantiles]
        per_version: list[tuple[ModelStatistics, dict[str, str], dict[str, list[float]]]] = []
        for version, labels in versions:
            latency = version.stats.latency
            if latency is None or latency.summaries is None:
                continue
            values = {kind: latency.summaries[kind].quantiles(wanted) for kind in SUMMARY_KINDS}
            per_version.append((version.stats, labels, values))
        for kind in SUMMARY_KINDS:
            name, help_text, field_name = SUMMARIES[kind]
            metric = Metric(name, help_text, "summary")
            for stats, labels, values in per_version:
                duration: Duration = getattr(stats, field_name)
                metric.add_sample(name + "_count", labels, float(duration.count))
                metric.add_sample(name + "_sum", labels, float(_us(duration)))
                for q, value in zip(wanted, values[kind], strict=True):
                    metric.add_sample(name, {**labels, "quantile": _bound(q)}, value)
            yield metric

    def _system_families(self) -> Iterator[Metric]:
        assert self.system is not None
        snapshot = self.system.snapshot
        for name, help_text, typ, attribute in GPU_FAMILIES:
            if not snapshot.gpus:
                break
            metric = Metric(name, help_text, typ)
            for gpu in snapshot.gpus:
                metric.add_sample(name, {"gpu_uuid": gpu.uuid}, float(getattr(gpu, attribute)))
            yield metric
        for name, help_text, attribute in CPU_FAMILIES:
            value = getattr(snapshot, attribute)
            if value is None:
                continue
            metric = Metric(name, help_text, "gauge")
            metric.add_sample(name, {}, float(value))
            yield metric


SHM_FAMILIES = (
    ("oceanus_shm_size_bytes", "Size of /dev/shm, in bytes", "gauge"),
    ("oceanus_shm_used_bytes", "Used bytes of /dev/shm (every process)", "gauge"),
    ("oceanus_shm_reserved_bytes", "Bytes of /dev/shm the loaded models' rings reserve", "gauge"),
    (
        "oceanus_shm_fallback",
        "Messages to or from a Python stub sent through its socket: /dev/shm had no room",
        "counter",
    ),
)


def shm_figures() -> dict[str, int]:
    """/dev/shm's size and use, what our rings reserve, and the fallbacks (not Triton's: these
    show when a container's /dev/shm is too small, see docs/python-backend.md)."""
    size, free = budget.usage()
    return {
        "size_bytes": size,
        "used_bytes": size - free,
        "reserved_bytes": budget.reserved(),
        "fallbacks": budget.fallbacks(),
    }


def _shm_families() -> Iterator[Metric]:
    figures = shm_figures()
    for (name, help_text, typ), value in zip(SHM_FAMILIES, figures.values(), strict=True):
        metric = Metric(name, help_text, typ)
        metric.add_sample(name, {}, float(value))
        yield metric


def _custom_families(families: list[FamilySnapshot]) -> Iterator[Metric]:
    """Families the models created, as they named and labelled them (after Triton's own, as
    Triton lists them: they are registered later)."""
    for family in families:
        metric = Metric(family.name, family.description, family.kind)
        for sample in family.samples:
            if family.kind != HISTOGRAM:
                metric.add_sample(family.name, sample.labels, sample.value)
                continue
            metric.add_sample(family.name + "_count", sample.labels, float(sample.count))
            metric.add_sample(family.name + "_sum", sample.labels, sample.value)
            for bound, count in sample.buckets:
                le = "+Inf" if math.isinf(bound) else _bound(bound)
                metric.add_sample(family.name + "_bucket", {**sample.labels, "le": le}, count)
        yield metric


def _bound(value: float) -> str:
    """A bucket bound or quantile as prometheus-cpp prints it (`100`, `0.5`)."""
    return f"{value:.16g}"
