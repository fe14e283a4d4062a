"""`GET /status.json` on the metrics port: what the status page shows, read from the core.

Every number comes from the same objects as `/v2/models/stats` and `/metrics` (ModelStatistics,
the scheduler's pending count, the repository index); counters are cumulative and the page
turns them into rates from one poll to the next, so the server keeps no history and does no
work between polls. The only thing kept for the page is a short window of request latencies
per version (for p50/p99), started the first time the page asks (`ModelStatistics.watch_recent`).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from oceanus import __version__
from oceanus.core.errors import InferenceServerError
from oceanus.core.model import ModelEntry, ModelVersion
from oceanus.core.observability.custom_metrics import HISTOGRAM, CustomMetricRegistry
from oceanus.core.observability.statistics import ModelStatistics
from oceanus.core.server import ServerCore, display_name
from oceanus.frontends.metrics.collector import shm_figures
from oceanus.frontends.metrics.process import ProcessSampler, count_connections
from oceanus.frontends.metrics.system import SystemMetrics
from oceanus.ipc import budget

# The window p50/p99 are computed over: short enough to follow a change in load within seconds,
# long enough to hold a few hundred requests of a slow model.
RECENT_WINDOW_S = 10.0
QUANTILES = (0.5, 0.99)
# How often the repositories are listed for folders no model was loaded from (explicit mode).
FOLDER_SCAN_S = 5.0
# A language model's figures: the vLLM families its backend keeps in the custom-metric registry
# (the LLM backend's, or a Python model's that names them as Triton's vLLM backend does),
# labelled by model and version; the page turns the cumulative ones into tokens/s and means.
LLM_FAMILIES = {
    "vllm:generation_tokens_total": "generation_tokens",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:time_to_first_token_seconds": "ttft",
    "vllm:time_per_output_token_seconds": "tpot",
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
}
LlmFigures = dict[tuple[str, str], dict[str, Any]]


def _config_summary(config: mc.ModelConfig) -> dict[str, Any]:
    kinds = mc.ModelInstanceGroup.Kind
    return {
        "platform": config.platform,
        "backend": config.backend or config.platform,
        "max_batch_size": config.max_batch_size,
        "instances": [
            {"kind": kinds.Name(group.kind), "count": group.count}
            for group in config.instance_group
        ],
        "dynamic_batching": config.HasField("dynamic_batching"),
        "sequence_batching": config.HasField("sequence_batching"),
        "ensemble": config.platform == "ensemble",
    }


def _latency(stats: ModelStatistics) -> dict[str, float | None]:
    values = stats.watch_recent(RECENT_WINDOW_S).quantiles(QUANTILES)
    p50, p99 = (None if math.isnan(v) else v for v in values)  # NaN: none in the window
    return {"p50_us": p50, "p99_us": p99, "window_s": RECENT_WINDOW_S}


def language_models(registry: CustomMetricRegistry) -> LlmFigures:
    """(model, version) -> its vLLM figures: counters and gauges as numbers, histograms as
    `{"count", "sum_s"}` (cumulative; the page differences them between polls)."""
    out: LlmFigures = {}
    for family in registry.snapshot():
        field = LLM_FAMILIES.get(family.name)
        if field is None:
            continue
        for sample in family.samples:
            key = (sample.labels.get("model", ""), sample.labels.get("version", ""))
            figures = out.setdefault(key, {})
            if family.kind == HISTOGRAM:
                figures[field] = {"count": sample.count, "sum_s": sample.value}
            else:
                figures[field] = sample.value
    return out


def _statistics(
    version: ModelVersion, cached: bool, llm: dict[str, Any] | None = None
) -> dict[str, Any]:
    stats = version.stats
    return {
        "success": stats.success.count,
        "fail": stats.fail.count,
        "inference_count": stats.inference_count,
        "execution_count": stats.execution_count,
        "pending": version.pending_count,
        # cumulative nanoseconds: request (successes) and its parts
        "ns": {
            "request": stats.success.ns,
            "queue": stats.queue.ns,
            "compute_input": stats.compute_input.ns,
            "compute_infer": stats.compute_infer.ns,
            "compute_output": stats.compute_output.ns,
        },
        # executions per batch size (the dynamic batcher's work)
        "batches": {str(size): b.compute_infer.count for size, b in sorted(stats.batches.items())},
        "failures": dict(stats.failures_by_reason),
        "cache": (
            {"hits": stats.cache_hit.count, "misses": stats.cache_miss.count} if cached else None
        ),
        "latency": _latency(stats),
        "llm": llm,  # a language model's tokens and times (None for other models)
    }


def _version_entry(
    core: ServerCore, key: str, version: ModelVersion, llm: LlmFigures
) -> dict[str, Any]:
    item: dict[str, Any] = {
        "key": key,
        "name": version.name,
        "version": version.version_str,
        "state": version.state.value,
        "reason": version.reason,
        **_config_summary(version.config),
    }
    if version.ready:
        figures = llm.get((version.name, version.version_str))
        item["stats"] = _statistics(version, core.cache_enabled(version), figures)
    return item


def models(core: ServerCore, folders: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Every model the core knows and every folder of the repositories (`folders`: model keys
    from a scan off the loop), as the repository index lists them, with config and statistics
    for each version that exists. `key` tells models of one name in several repositories apart
    (--model-namespacing); `name` is the name the API shows."""
    out: list[dict[str, Any]] = []
    llm = language_models(core.custom_metrics)
    for key in sorted(set(folders) | set(core.models)):
        entry: ModelEntry | None = core.models.get(key)
        if entry is not None and entry.versions:
            out.extend(_version_entry(core, key, v, llm) for _, v in sorted(entry.versions.items()))
            continue
        # never loaded (explicit mode), unloaded, or failed before any version existed
        error = entry.error if entry is not None else ""
        out.append(
            {
                "key": key,
                "name": display_name(key),
                "version": "",
                "state": "UNAVAILABLE" if error else "UNLOADED",
                "reason": error,
            }
        )
    return out


def scan_folders(core: ServerCore) -> set[str]:
    """The model keys of the server's repositories (blocking: a few directory listings)."""
    try:
        return set(core.manager.scan())
    except (InferenceServerError, OSError):
        return set()


class StatusSource:
    """Builds the status document; `ports` names the ports whose connections are counted."""

    def __init__(
        self,
        core: ServerCore,
        server_id: str,
        system: SystemMetrics | None,
        ports: Callable[[], Mapping[int, str]],
    ) -> None:
        self.core = core
        self.server_id = server_id
        self.system = system
        self.ports = ports
        self.process = ProcessSampler()
        self.started = time.monotonic()
        self._connections: dict[str, int] | None = None
        self._connections_at = 0.0
        self._folders: set[str] = set()
        self._folders_at = -FOLDER_SCAN_S
        self._lock = threading.Lock()  # two pages polling at once read /proc once

    def refresh(self) -> None:
        """The blocking readings (/proc, the repositories' folders), each at most once per
        its interval; run off the loop."""
        with self._lock:
            now = time.monotonic()
            self.process.sample()
            if now - self._connections_at >= self.process.min_interval_s:
                self._connections = count_connections(self.ports())
                self._connections_at = now
            if now - self._folders_at >= FOLDER_SCAN_S:
                self._folders = scan_folders(self.core)
                self._folders_at = now

    def document(self) -> dict[str, Any]:
        """The status document (on the loop: reads the core's statistics, no I/O)."""
        core = self.core
        process = self.process.latest
        machine = self.system.snapshot if self.system is not None else None
        return {
            "time": time.monotonic(),
            "uptime_s": time.monotonic() - self.started,
            "server": {
                "id": self.server_id,
                "version": __version__,
                "live": core.live,
                "ready": core.ready(),
                "cache": core.response_cache is not None,
                "control_mode": core.options.control_mode,
            },
            "process": {
                "cpu_percent": self.process.cpu_percent(),
                "cpu_seconds": process.cpu_seconds if process else None,
                "rss_bytes": process.rss_bytes if process and process.rss_bytes else None,
                "processes": process.processes if process else None,
                "cpus": _cpus(),
            },
            "connections": self._connections,
            "machine": {
                "cpu_utilization": machine.cpu_utilization if machine else None,
                "memory_total_bytes": machine.cpu_memory_total_bytes if machine else None,
                "memory_used_bytes": machine.cpu_memory_used_bytes if machine else None,
            },
            # Per model, what its instances' rings reserve now and at start (they grow).
            "shared_memory": {**shm_figures(), "rings": budget.held_by_label()},
            "models": models(core, self._folders),
        }


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
