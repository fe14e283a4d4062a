"""Per model version statistics: the one source for `/v2/models/stats` and Prometheus metrics.

All updates happen on the event loop thread (the scheduler reports completed batches there), so
no locks are needed; readers on the same loop see consistent numbers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from oceanus.core.observability.latency import LatencyOptions, LatencyRecorder, WindowedQuantiles


@dataclass(slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass(slots=True)
class BatchStats:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


# Reasons Triton's `nv_inference_request_failure` metric labels failures with.
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")

# Makes the latency distributions (Prometheus summaries/histograms) of each new ModelStatistics;
# set by the metrics frontend before models load, None (the default) records none.
_latency_factory: Callable[[], LatencyRecorder] | None = None


def set_latency_factory(factory: Callable[[], LatencyRecorder] | None) -> None:
    """Record latency distributions for model versions created from now on (None: stop)."""
    global _latency_factory
    _latency_factory = factory


def _new_latency_recorder() -> LatencyRecorder | None:
    return _latency_factory() if _latency_factory is not None else None


@dataclass(slots=True)
class ModelStatistics:
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    cache_hit: Duration = field(default_factory=Duration)
    cache_miss: Duration = field(default_factory=Duration)
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    batches: dict[int, BatchStats] = field(default_factory=dict)
    failures_by_reason: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(FAILURE_REASONS, 0)
    )
    latency: LatencyRecorder | None = field(default_factory=_new_latency_recorder)

    def record_success(
        self,
        request_ns: int,
        queue_ns: int,
        input_ns: int,
        infer_ns: int,
        output_ns: int,
        rows: int,
        first_response: bool = True,
    ) -> None:
        # Duration.add, inlined: five calls per request on the core's path
        success, queue = self.success, self.queue
        success.count += 1
        success.ns += request_ns
        queue.count += 1
        queue.ns += queue_ns
        compute = self.compute_input
        compute.count += 1
        compute.ns += input_ns
        compute = self.compute_infer
        compute.count += 1
        compute.ns += infer_ns
        compute = self.compute_output
        compute.count += 1
        compute.ns += output_ns
        self.inference_count += rows
        self.last_inference_ms = time.time_ns() // 1_000_000
        if self.latency is not None:
            self.latency.observe(
                request_ns, queue_ns, input_ns, infer_ns, output_ns, first_response
            )

    def watch_recent(self, window_s: float, slots: int = 5) -> WindowedQuantiles:
        """The quantiles of the request latencies of the last `window_s` seconds, kept from the
        first call on (the status page asks; until then requests pay nothing for it)."""
        latency = self.latency
        if latency is None:
            latency = self.latency = LatencyRecorder(LatencyOptions())
        if latency.recent is None:
            latency.recent = WindowedQuantiles(window_s, slots)
        return latency.recent

    def record_cache_hit(self, request_ns: int, queue_ns: int, hit_ns: int) -> None:
        """A request answered from the response cache: a success with no execution (no
        inference count, no compute times, no last_inference), as Triton's
        UpdateSuccessCacheHit counts it."""
        self.success.add(request_ns)
        self.queue.add(queue_ns)
        self.cache_hit.add(hit_ns)

    def record_cache_miss(self, miss_ns: int) -> None:
        """A request the cache missed, executed and stored: the lookup and insertion time,
        also added to the request's duration (Triton's UpdateSuccessCacheMiss)."""
        self.success.ns += miss_ns
        self.cache_miss.add(miss_ns)

    def record_failure(self, request_ns: int, reason: str) -> None:
        self.fail.add(request_ns)
        self.failures_by_reason[reason] = self.failures_by_reason.get(reason, 0) + 1
        self.last_inference_ms = time.time_ns() // 1_000_000

    def record_execution(
        self, batch_size: int, input_ns: int, infer_ns: int, output_ns: int
    ) -> None:
        self.execution_count += 1
        stats = self.batches.get(batch_size)
        if stats is None:
            stats = self.batches[batch_size] = BatchStats()
        compute = stats.compute_input  # Duration.add, inlined (once per execution)
        compute.count += 1
        compute.ns += input_ns
        compute = stats.compute_infer
        compute.count += 1
        compute.ns += infer_ns
        compute = stats.compute_output
        compute.count += 1
        compute.ns += output_ns

    def as_dict(self, name: str, version: str) -> dict[str, Any]:
        """Triton's layout of one entry of `model_stats`."""
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.as_dict(),
                "fail": self.fail.as_dict(),
                "queue": self.queue.as_dict(),
                "compute_input": self.compute_input.as_dict(),
                "compute_infer": self.compute_infer.as_dict(),
                "compute_output": self.compute_output.as_dict(),
                "cache_hit": self.cache_hit.as_dict(),
                "cache_miss": self.cache_miss.as_dict(),
            },
            "response_stats": {},
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": stats.compute_input.as_dict(),
                    "compute_infer": stats.compute_infer.as_dict(),
                    "compute_output": stats.compute_output.as_dict(),
                }
                for size, stats in sorted(self.batches.items())
            ],
            "memory_usage": [],
        }
