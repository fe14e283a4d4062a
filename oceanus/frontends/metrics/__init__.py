"""The Prometheus metrics endpoint (`GET /metrics` on `--metrics-port`) with Triton's metrics."""

from oceanus.frontends.metrics.collector import TritonCollector
from oceanus.frontends.metrics.config import MetricsConfig, parse_metrics_config
from oceanus.frontends.metrics.server import MetricsFrontend, MetricsOptions

__all__ = [
    "MetricsConfig",
    "MetricsFrontend",
    "MetricsOptions",
    "TritonCollector",
    "parse_metrics_config",
]
