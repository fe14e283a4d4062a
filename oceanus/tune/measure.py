"""One measurement: a configuration under one concurrency, with the client's throughput and
latency percentiles (perf_analyzer or the built-in generator) and the server's own view of the
same run (average batch size, queue and compute time) from the statistics extension."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from oceanus.tune import loadgen
from oceanus.tune.perf_analyzer import PerfAnalyzer
from oceanus.tune.target import Target


@dataclass
class Measurement:
    config_id: int
    phase: str  # "sweep" or "side-by-side"
    concurrency: int
    throughput: float  # inferences per second
    p50_ms: float
    p90_ms: float
    p99_ms: float
    avg_ms: float
    errors: int
    seconds: float  # wall-clock time the measurement took
    avg_batch: float | None  # inferences per model execution, server side
    queue_us: float | None  # mean per request, server side
    compute_us: float | None  # compute input + infer + output, mean per request
    generator: str
    error: str = ""

    def within(self, budget_ms: float) -> bool:
        return not self.error and self.errors == 0 and self.p99_ms <= budget_ms

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _server_side(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float | None]:
    def count(stats: dict[str, Any], key: str) -> int:
        return int(stats["inference_stats"][key]["count"])

    def ns(stats: dict[str, Any], key: str) -> int:
        return int(stats["inference_stats"][key]["ns"])

    executions = after["execution_count"] - before["execution_count"]
    inferences = after["inference_count"] - before["inference_count"]
    requests = count(after, "success") - count(before, "success")
    compute = sum(
        ns(after, k) - ns(before, k) for k in ("compute_input", "compute_infer", "compute_output")
    )
    return {
        "avg_batch": inferences / executions if executions > 0 else None,
        "queue_us": (ns(after, "queue") - ns(before, "queue")) / requests / 1000
        if requests > 0
        else None,
        "compute_us": compute / requests / 1000 if requests > 0 else None,
    }


class Meter:
    """Measures the model at one concurrency with the chosen generator."""

    def __init__(
        self,
        target: Target,
        model: str,
        payload: bytes,
        perf_analyzer: PerfAnalyzer | None,
    ) -> None:
        self.target = target
        self.model = model
        self.payload = payload
        self.perf_analyzer = perf_analyzer

    @property
    def generator(self) -> str:
        return "perf_analyzer" if self.perf_analyzer is not None else "built-in"

    def measure(self, config_id: int, phase: str, concurrency: int, window_s: float) -> Measurement:
        started = time.monotonic()
        before = self.target.statistics(self.model)
        error = ""
        try:
            if self.perf_analyzer is not None:
                result = self.perf_analyzer.measure(concurrency, window_s)
                throughput, errors = result.throughput, 0
                p50, p90, p99, avg = result.p50_us, result.p90_us, result.p99_us, result.avg_us
            else:
                load = loadgen.run_load(
                    self.target.host, self.target.port, self.payload, concurrency, window_s
                )
                throughput, errors = load.completed / load.window_s, load.errors
                if load.latencies_us:
                    p50, p90, p99 = (
                        float(v) for v in np.percentile(load.latencies_us, [50, 90, 99])
                    )
                    avg = float(np.mean(load.latencies_us))
                else:
                    p50 = p90 = p99 = avg = float("inf")
        except (RuntimeError, OSError, ValueError) as exc:
            error = str(exc)
            throughput, errors = 0.0, 0
            p50 = p90 = p99 = avg = float("inf")
        server = _server_side(before, self.target.statistics(self.model))
        return Measurement(
            config_id=config_id,
            phase=phase,
            concurrency=concurrency,
            throughput=throughput,
            p50_ms=p50 / 1000,
            p90_ms=p90 / 1000,
            p99_ms=p99 / 1000,
            avg_ms=avg / 1000,
            errors=errors,
            seconds=time.monotonic() - started,
            avg_batch=server["avg_batch"],
            queue_us=server["queue_us"],
            compute_us=server["compute_us"],
            generator=self.generator,
            error=error,
        )
