"""Latency distributions for Prometheus summaries and histograms (off unless `--metrics-config`
asks for them).

The cumulative counters (`nv_inference_*_duration_us`) and every count come from
`ModelStatistics` itself; this module only keeps what a total cannot give: the shape of the
distribution. A `LatencyRecorder` is attached to a model version's statistics when it is created
and is fed from `ModelStatistics.record_success` on the event loop, so it needs no lock.

Summaries follow prometheus-cpp (which Triton uses): quantiles over a sliding window of
`max_age_s` seconds split into `age_buckets` slots. Instead of CKMS each slot is a log-scaled
histogram (buckets 1 % wide), so an observation is one `log` and one dict update and memory does not
grow with traffic; a quantile is exact to within about 1 %.

The status page on the metrics port (docs/status-page.md) reads p50/p99 of a short `recent` window
of request latencies, which `ModelStatistics.watch_recent` adds to a version's recorder the first
time the page asks, so a server nobody watches pays nothing for it.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

# Triton's defaults (core metric_model_reporter.h).
DEFAULT_QUANTILES: tuple[tuple[float, float], ...] = (
    (0.5, 0.05),
    (0.9, 0.01),
    (0.95, 0.001),
    (0.99, 0.001),
    (0.999, 0.001),
)
DEFAULT_FIRST_RESPONSE_BUCKETS_MS: tuple[float, ...] = (100.0, 500.0, 2000.0, 5000.0)

# The five latencies a summary is kept for, in the order `observe` takes them.
SUMMARY_KINDS = ("request", "queue", "compute_input", "compute_infer", "compute_output")

_GROWTH = 1.01
_INV_LOG_GROWTH = 1.0 / math.log(_GROWTH)


@dataclass(frozen=True)
class LatencyOptions:
    summaries: bool = False
    quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES
    histogram: bool = False
    histogram_buckets_ms: tuple[float, ...] = DEFAULT_FIRST_RESPONSE_BUCKETS_MS
    max_age_s: float = 60.0
    age_buckets: int = 5

    @property
    def enabled(self) -> bool:
        return self.summaries or self.histogram


def _bucket_of(value_us: int) -> int:
    if value_us < 1:
        return 0
    return 1 + int(math.log(value_us) * _INV_LOG_GROWTH)


def _value_of(bucket: int) -> float:
    """A representative value of a log bucket (its geometric middle, whole microseconds)."""
    if bucket == 0:
        return 0.0
    return float(round(_GROWTH ** (bucket - 1 + 0.5)))


class WindowedQuantiles:
    """Quantiles of the observations of the last `max_age_s` seconds (between
    `max_age_s * (n-1)/n` and `max_age_s` of them, as prometheus-cpp's rotating buckets)."""

    __slots__ = ("_current", "_rotate_at", "_slot_s", "_slots")

    def __init__(self, max_age_s: float = 60.0, age_buckets: int = 5) -> None:
        count = max(1, age_buckets)
        self._slot_s = max_age_s / count
        self._slots: list[dict[int, int]] = [{} for _ in range(count)]
        self._current = 0
        self._rotate_at = time.monotonic() + self._slot_s

    def _rotate(self, now: float) -> None:
        while now >= self._rotate_at:
            self._current = (self._current + 1) % len(self._slots)
            self._slots[self._current].clear()
            self._rotate_at += self._slot_s

    def observe(self, value_us: int, now: float) -> None:
        if now >= self._rotate_at:
            self._rotate(now)
        slot = self._slots[self._current]
        key = _bucket_of(value_us)
        slot[key] = slot.get(key, 0) + 1

    def quantiles(self, wanted: Sequence[float], now: float | None = None) -> list[float]:
        """The value at each quantile in `wanted` (NaN when the window is empty, as Triton)."""
        self._rotate(time.monotonic() if now is None else now)
        merged: dict[int, int] = {}
        for slot in self._slots:
            for key, count in slot.items():
                merged[key] = merged.get(key, 0) + count
        total = sum(merged.values())
        if total == 0:
            return [math.nan for _ in wanted]
        keys = sorted(merged)
        results = []
        for q in wanted:
            rank = max(1, math.ceil(q * total))
            seen = 0
            value = _value_of(keys[-1])
            for key in keys:
                seen += merged[key]
                if seen >= rank:
                    value = _value_of(key)
                    break
            results.append(value)
        return results


class FixedHistogram:
    """A Prometheus histogram with fixed upper bounds (`le`), cumulative when read."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(sorted(bounds))
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, cumulative count) pairs, ending with (+Inf, total)."""
        out = []
        running = 0
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


class LatencyRecorder:
    """One model version's latency distributions."""

    __slots__ = ("first_response", "options", "recent", "summaries")

    def __init__(self, options: LatencyOptions) -> None:
        self.options = options
        self.summaries: dict[str, WindowedQuantiles] | None = (
            {
                kind: WindowedQuantiles(options.max_age_s, options.age_buckets)
                for kind in SUMMARY_KINDS
            }
            if options.summaries
            else None
        )
        self.first_response = (
            FixedHistogram(options.histogram_buckets_ms) if options.histogram else None
        )
        # Request latencies of the last few seconds, for the status page (None: nobody asked).
        self.recent: WindowedQuantiles | None = None

    def observe_first_response(self, request_ns: int) -> None:
        """A decoupled request's first response left `request_ns` after the request came."""
        if self.first_response is not None:
            self.first_response.observe(request_ns // 1_000_000)

    def observe(
        self,
        request_ns: int,
        queue_ns: int,
        input_ns: int,
        infer_ns: int,
        output_ns: int,
        first_response: bool = True,
    ) -> None:
        """One successful request (called from `ModelStatistics.record_success`);
        `first_response` false for a decoupled request, whose first response is observed when
        it is sent (`observe_first_response`)."""
        if first_response and self.first_response is not None:
            # Triton: whole milliseconds from request start to its first response.
            self.first_response.observe(request_ns // 1_000_000)
        summaries = self.summaries
        recent = self.recent
        if summaries is None and recent is None:
            return
        now = time.monotonic()
        if recent is not None:
            recent.observe(request_ns // 1000, now)
        if summaries is not None:
            summaries["request"].observe(request_ns // 1000, now)
            summaries["queue"].observe(queue_ns // 1000, now)
            summaries["compute_input"].observe(input_ns // 1000, now)
            summaries["compute_infer"].observe(infer_ns // 1000, now)
            summaries["compute_output"].observe(output_ns // 1000, now)
