"""Prometheus text format (0.0.4) written the way Triton's prometheus-cpp writes it.

prometheus_client's own `generate_latest` renames every counter to `<name>_total`; Triton's
counters have no such suffix (`nv_inference_request_success`), and dashboards and alerts written
for Triton query those names, so the families from our collector are rendered here instead:
`# HELP`, `# TYPE`, then the samples as the collector added them (summary and histogram `_count`
and `_sum` first, then quantiles or buckets, as prometheus-cpp orders them), integral values
without a trailing `.0`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from prometheus_client.metrics_core import Metric

CONTENT_TYPE = "text/plain; charset=utf-8"


def format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.16g}"


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def render(families: Iterable[Metric]) -> bytes:
    out: list[str] = []
    for family in families:
        out.append(f"# HELP {family.name} {_escape_help(family.documentation)}\n")
        out.append(f"# TYPE {family.name} {family.type}\n")
        for sample in family.samples:
            if sample.labels:
                labels = ",".join(f'{k}="{_escape_label(v)}"' for k, v in sample.labels.items())
                out.append(f"{sample.name}{{{labels}}} {format_value(sample.value)}\n")
            else:
                out.append(f"{sample.name} {format_value(sample.value)}\n")
    return "".join(out).encode()
