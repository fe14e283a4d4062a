"""Custom metric families that backends create for their models (Triton's TRITONSERVER_Metric*
API; the Python backend's `pb_utils.MetricFamily` / `Metric`), exported by the metrics frontend.

Semantics are Triton core's (metric_family.cc over prometheus-cpp): families are keyed by name (a
second family of the same name and kind is the same family, its first description kept; another
kind is an error), metrics by their labels (two owners asking for the same labels share one
value, kept until both let go), counters only go up, gauges are set or moved, histograms observe.
A family is exported only while it holds at least one metric. Owners (one per Python stub)
release everything they hold when they go away (model unloaded, stub gone).

Thread-safe: owners update from their own threads, the metrics frontend reads `snapshot()` on the
event loop at scrape time.
"""

from __future__ import annotations

import bisect
import math
import re
import threading
from dataclasses import dataclass, field

COUNTER = "counter"
GAUGE = "gauge"
HISTOGRAM = "histogram"
KINDS = (COUNTER, GAUGE, HISTOGRAM)

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

LabelsKey = tuple[tuple[str, str], ...]


class MetricError(Exception):
    """A refused metric operation; the text is Triton's (prometheus-cpp's for names)."""


@dataclass
class _Value:
    kind: str
    buckets: tuple[float, ...] = ()
    value: float = 0.0  # counter, gauge; the sum for a histogram
    count: int = 0  # histogram observations
    bucket_counts: list[int] = field(default_factory=list)  # per bucket, not cumulative
    refs: int = 0


@dataclass
class _Family:
    name: str
    description: str
    kind: str
    metrics: dict[LabelsKey, _Value] = field(default_factory=dict)


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float = 0.0
    # histograms: (upper bound, cumulative count) per bucket, +Inf last; count and sum
    buckets: tuple[tuple[float, int], ...] = ()
    count: int = 0


@dataclass(frozen=True)
class FamilySnapshot:
    name: str
    description: str
    kind: str
    samples: tuple[Sample, ...]


class CustomMetricRegistry:
    """Every custom family of the server; owners reach it through `owner()`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, _Family] = {}  # in creation order, as prometheus-cpp lists them

    def owner(self) -> MetricOwner:
        return MetricOwner(self)

    def snapshot(self) -> list[FamilySnapshot]:
        """Families holding at least one metric, with their current values."""
        out = []
        with self._lock:
            for family in self._families.values():
                if not family.metrics:
                    continue
                samples = []
                for key, value in sorted(family.metrics.items()):
                    labels = dict(key)
                    if family.kind == HISTOGRAM:
                        cumulative, total = [], 0
                        for bound, count in zip(value.buckets, value.bucket_counts, strict=False):
                            total += count
                            cumulative.append((bound, total))
                        cumulative.append((math.inf, value.count))
                        samples.append(Sample(labels, value.value, tuple(cumulative), value.count))
                    else:
                        samples.append(Sample(labels, value.value))
                out.append(
                    FamilySnapshot(family.name, family.description, family.kind, tuple(samples))
                )
        return out

    # ---- used by MetricOwner, under the lock ---------------------------------------------------

    def _family(self, name: str, description: str, kind: str) -> _Family:
        if kind not in KINDS:
            raise MetricError("Unsupported kind passed to MetricFamily constructor.")
        if not _NAME.match(name):
            raise MetricError("Invalid metric name")
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = _Family(name, description, kind)
        elif family.kind != kind:
            raise MetricError("Family name already exists with different type")
        return family

    def _metric(
        self, family: _Family, labels: dict[str, str], buckets: list[float] | None
    ) -> tuple[LabelsKey, _Value]:
        for label in labels:
            if not _LABEL.match(label) or label.startswith("__"):
                raise MetricError("Invalid label name")
        if family.kind == HISTOGRAM:
            if buckets is None:
                raise MetricError("Bucket boundaries not found in Metric args.")
            if any(b >= a for a, b in zip(buckets[1:], buckets, strict=False)):
                raise MetricError("Bucket Boundaries must be strictly sorted")
        elif buckets is not None:
            raise MetricError(f"Unexpected args found in {family.kind} Metric constructor.")
        key = tuple(sorted(labels.items()))
        value = family.metrics.get(key)
        if value is None:
            bounds = tuple(float(b) for b in buckets or ())
            value = family.metrics[key] = _Value(
                family.kind, bounds, bucket_counts=[0] * len(bounds)
            )
        value.refs += 1
        return key, value


class MetricOwner:
    """What one owner (a Python stub) created, by the ids it chose; `close()` lets go of all."""

    def __init__(self, registry: CustomMetricRegistry) -> None:
        self._registry = registry
        self._families: dict[int, _Family] = {}
        self._metrics: dict[int, tuple[_Family, LabelsKey, _Value]] = {}
        self._closed = False

    def new_family(self, family_id: int, name: str, description: str, kind: str) -> None:
        with self._registry._lock:
            self._families[family_id] = self._registry._family(name, description, kind)

    def new_metric(
        self,
        metric_id: int,
        family_id: int,
        labels: dict[str, str],
        buckets: list[float] | None,
    ) -> None:
        with self._registry._lock:
            family = self._families.get(family_id)
            if family is None:
                raise MetricError("Invalid metric family")
            key, value = self._registry._metric(family, labels, buckets)
            self._metrics[metric_id] = (family, key, value)

    def update(self, metric_id: int, operation: str, amount: float) -> None:
        """ "increment", "set" or "observe" (the caller checked the kind allows it)."""
        with self._registry._lock:
            found = self._metrics.get(metric_id)
            if found is None:
                return
            value = found[2]
            if operation == "increment":
                if value.kind == COUNTER and amount < 0:
                    return
                value.value += amount
            elif operation == "set":
                value.value = amount
            elif operation == "observe":
                value.value += amount
                value.count += 1
                index = bisect.bisect_left(value.buckets, amount)
                if index < len(value.buckets):
                    value.bucket_counts[index] += 1

    def value(self, metric_id: int) -> float:
        with self._registry._lock:
            found = self._metrics.get(metric_id)
            if found is None:
                raise MetricError("Could not get metric value. Metric has been invalidated.")
            if found[2].kind == HISTOGRAM:
                raise MetricError("TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value")
            return found[2].value

    def delete_metric(self, metric_id: int) -> None:
        with self._registry._lock:
            self._release(metric_id)

    def delete_family(self, family_id: int) -> None:
        """The family and every metric this owner made in it."""
        with self._registry._lock:
            family = self._families.pop(family_id, None)
            if family is None:
                return
            for metric_id in [m for m, (f, _, _) in self._metrics.items() if f is family]:
                self._release(metric_id)

    def close(self) -> None:
        with self._registry._lock:
            for metric_id in list(self._metrics):
                self._release(metric_id)
            self._families.clear()

    def _release(self, metric_id: int) -> None:
        found = self._metrics.pop(metric_id, None)
        if found is None:
            return
        family, key, value = found
        value.refs -= 1
        if value.refs <= 0 and family.metrics.get(key) is value:
            del family.metrics[key]
