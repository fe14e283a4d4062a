"""What the core records about its work, for the frontends to export.

`statistics` is the one source for `/v2/models/stats` and the Prometheus counters (updated on
the event loop, no locks); `latency` keeps the distributions for summaries and histograms;
`custom_metrics` holds the metric families backends create (pb_utils.MetricFamily); `tracing`
is Triton's request tracing (settings, sampling, trace files) and `tracing_otel` its
OpenTelemetry mode. The core writes here; the metrics, HTTP and gRPC frontends read.
"""
