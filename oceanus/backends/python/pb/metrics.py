"""pb_utils' custom metrics (MetricFamily, Metric): their values live in the server, which
exports them on /metrics; operations travel through the stub's runtime."""

from __future__ import annotations

import collections
import itertools

from oceanus.backends.python.pb import runtime
from oceanus.backends.python.pb.types import TritonModelException

# Deletions noted by __del__ (which may run inside any other call, under any lock, when the
# garbage collector runs); sent before the next metric call or at the end of execute.
DEFERRED: collections.deque[tuple[str, int]] = collections.deque()
_METRIC_IDS = itertools.count(1)
_KIND_NAMES = {0: "counter", 1: "gauge", 2: "histogram"}
_CLEARED = (
    "Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The "
    "'MetricFamily' object should be deleted AFTER its corresponding 'Metric' objects have been "
    "deleted."
)


def flush_deferred() -> None:
    """Send the deletions noted since the last call."""
    while DEFERRED:
        try:
            what, number = DEFERRED.popleft()
        except IndexError:
            return
        runtime.current().metric_delete(what, number)


class Metric:
    """One labelled metric of a MetricFamily. Its value lives in the server: operations are sent
    to it (increment/set/observe without waiting; `value()` asks), and /metrics exports it."""

    def __init__(
        self, family: MetricFamily, labels: dict[str, str], buckets: list[float] | None
    ) -> None:
        self._id = next(_METRIC_IDS)
        self._kind = family._kind
        self._cleared = True  # until the server accepted it
        flush_deferred()
        try:
            runtime.current().metric_call("metric_new", self._id, family._id, labels, buckets)
        except TritonModelException as exc:
            raise TritonModelException(f"Error when creating Metric: {exc.message()}") from None
        self._cleared = False

    def _update(self, operation: str, value: float, failure: str) -> None:
        if self._cleared:
            raise TritonModelException(f"{failure}: {_CLEARED}")
        kind = self._kind
        refused = None
        if operation == "increment":
            if kind == MetricFamily.COUNTER and value < 0:
                refused = (
                    "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically "
                    "by non-negative values."
                )
            elif kind == MetricFamily.HISTOGRAM:
                refused = "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Increment"
        elif operation == "set" and kind != MetricFamily.GAUGE:
            refused = f"TRITONSERVER_METRIC_KIND_{_KIND_NAMES[kind].upper()} does not support Set"
        elif operation == "observe" and kind != MetricFamily.HISTOGRAM:
            refused = (
                f"TRITONSERVER_METRIC_KIND_{_KIND_NAMES[kind].upper()} does not support Observe"
            )
        if refused is not None:
            raise TritonModelException(f"{failure}: {refused}")
        flush_deferred()
        runtime.current().metric_update(self._id, operation, float(value))

    def increment(self, value: float) -> None:
        self._update("increment", value, "Failed to increment metric value")

    def set(self, value: float) -> None:
        self._update("set", value, "Failed to set metric value")

    def observe(self, value: float) -> None:
        self._update("observe", value, "Failed to observe metric value")

    def value(self) -> float:
        if self._cleared:
            raise TritonModelException(f"Failed to get metric value: {_CLEARED}")
        flush_deferred()
        try:
            return float(runtime.current().metric_call("metric_value", self._id))
        except TritonModelException as exc:
            raise TritonModelException(f"Failed to get metric value: {exc.message()}") from None

    def __del__(self) -> None:
        if not getattr(self, "_cleared", True):
            DEFERRED.append(("metric", self._id))


class MetricFamily:
    """Triton's custom metrics API: `MetricFamily(name, description, kind)`, then
    `family.Metric(labels={...})` (histograms: `buckets=[...]`). Families and their metrics are
    kept by the server and exported on its /metrics endpoint; deleting a family (or unloading the
    model) removes it and its metrics there."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2

    def __init__(self, name: str, description: str, kind: int) -> None:
        if kind not in (self.COUNTER, self.GAUGE, self.HISTOGRAM):
            raise TritonModelException("MetricFamily kind must be COUNTER, GAUGE or HISTOGRAM")
        self._id = next(_METRIC_IDS)
        self._name = name
        self._description = description
        self._kind = kind
        # The family keeps its metrics (as Triton's does): they go when the family goes.
        self._metrics: list[Metric] = []
        self._created = False
        flush_deferred()
        try:
            runtime.current().metric_call(
                "family_new", self._id, str(name), str(description), _KIND_NAMES[kind]
            )
        except TritonModelException as exc:
            raise TritonModelException(
                f"Error when creating MetricFamily: {exc.message()}"
            ) from None
        self._created = True

    def Metric(
        self, labels: dict[str, str] | None = None, buckets: list[float] | None = None
    ) -> Metric:
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        if buckets is not None:
            if not isinstance(buckets, list):
                raise TritonModelException("Failed to create metric. Buckets must be a list.")
            if self._kind != self.HISTOGRAM:
                raise TritonModelException("Failed to create metric. Unexpected buckets found.")
            buckets = [float(b) for b in buckets]
        elif self._kind == self.HISTOGRAM:
            raise TritonModelException("Failed to create metric. Missing required buckets.")
        metric = Metric(self, {str(k): str(v) for k, v in (labels or {}).items()}, buckets)
        self._metrics.append(metric)
        return metric

    def __del__(self) -> None:
        if not getattr(self, "_created", False):
            return
        for metric in self._metrics:
            metric._cleared = True
        self._metrics = []
        DEFERRED.append(("family", self._id))
