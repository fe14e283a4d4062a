"""`--metrics-config <setting>=<value>` as Triton reads it (core metric_model_reporter.cc)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from oceanus.core.observability.latency import DEFAULT_QUANTILES, LatencyOptions

log = logging.getLogger("oceanus.metrics")

KNOWN_SETTINGS = (
    "counter_latencies",
    "histogram_latencies",
    "summary_latencies",
    "summary_quantiles",
)


@dataclass(frozen=True)
class MetricsConfig:
    counter_latencies: bool = True
    histogram_latencies: bool = False
    summary_latencies: bool = False
    summary_quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES

    def latency_options(self) -> LatencyOptions:
        return LatencyOptions(
            summaries=self.summary_latencies,
            quantiles=self.summary_quantiles,
            histogram=self.histogram_latencies,
        )


def parse_quantiles(text: str) -> tuple[tuple[float, float], ...]:
    """`"0.5:0.05,0.9:0.01"` (commas or spaces between pairs) -> ((0.5, 0.05), (0.9, 0.01))."""
    pairs = []
    for item in text.replace(",", " ").split():
        quantile, sep, error = item.partition(":")
        if not sep:
            raise ValueError(
                f"invalid quantile pair '{item}': no ':' delimiter found. "
                "Expected format is <quantile>:<error>"
            )
        q, e = float(quantile), float(error)
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile {q} is not in [0.0, 1.0]")
        pairs.append((q, e))
    return tuple(pairs)


def parse_metrics_config(settings: dict[str, str]) -> MetricsConfig:
    """Interpret the `--metrics-config` map; as in Triton, only the literal values "true" and
    "false" switch a family, and an unparsable quantile list keeps the defaults (with an error)."""
    counter = settings.get("counter_latencies", "true") != "false"
    histogram = settings.get("histogram_latencies", "false") == "true"
    summary = settings.get("summary_latencies", "false") == "true"
    quantiles = DEFAULT_QUANTILES
    if "summary_quantiles" in settings:
        try:
            quantiles = parse_quantiles(settings["summary_quantiles"]) or DEFAULT_QUANTILES
        except ValueError as exc:
            log.error("--metrics-config summary_quantiles: %s; using the defaults", exc)
    for key in settings:
        if key not in KNOWN_SETTINGS:
            log.warning("unknown --metrics-config setting '%s' ignored", key)
    return MetricsConfig(counter, histogram, summary, quantiles)
