"""Trace mode "opentelemetry": finished traces become spans exported over OTLP/HTTP.

The spans are Triton's: a root span "InferRequest" holding the frontend's timestamps as events,
a span per model (named after it, attributes triton.model_name / model_version / trace_id /
trace_parent_id / request_id) holding REQUEST_START ... REQUEST_END, and under it a "compute"
span holding COMPUTE_START ... COMPUTE_END. A request that carried a W3C `traceparent` header
continues the client's trace. Spans are built when the trace finishes, from the monotonic
timestamps shifted to wall-clock time; the SDK's batch span processor exports them from its
own thread. Needs the optional dependency `pip install 'oceanus[opentelemetry]'`.
"""

from __future__ import annotations

import time
from typing import Any

from oceanus.core.observability.tracing import Trace

DEFAULT_URL = "http://localhost:4318/v1/traces"
SERVICE_NAME = "triton-inference-server"
COMPUTE = ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")
MISSING = (
    "trace mode 'opentelemetry' needs the OpenTelemetry SDK and its OTLP/HTTP exporter: "
    "pip install 'oceanus[opentelemetry]'"
)


class OtlpSpanExporter:
    """`options`: the `--trace-config opentelemetry,<k>=<v>` pairs (url, resource, bsp_*)."""

    def __init__(self, options: list[tuple[str, str]]) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.trace import SpanKind, set_span_in_context
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )
        except ImportError:
            raise RuntimeError(MISSING) from None
        url = DEFAULT_URL
        attributes = {"service.name": SERVICE_NAME}
        batch: dict[str, Any] = {}
        for key, value in options:
            if key == "url":
                url = value
            elif key == "resource":
                name, _, text = value.partition("=")
                attributes[name] = text
            elif key == "bsp_max_queue_size":
                batch["max_queue_size"] = int(value)
            elif key == "bsp_schedule_delay":
                batch["schedule_delay_millis"] = int(value)
            elif key == "bsp_max_export_batch_size":
                batch["max_export_batch_size"] = int(value)
        # The server's own provider (not the process-global one), so it never clashes with a
        # user's OpenTelemetry setup inside a Python model.
        self._provider = TracerProvider(resource=Resource.create(attributes))
        self._provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=url), **batch)
        )
        self._tracer = self._provider.get_tracer("triton-server")
        self._kind = SpanKind.SERVER
        self._in_context = set_span_in_context
        self._propagator = TraceContextTextMapPropagator()
        self._offset = time.time_ns() - time.monotonic_ns()
        self.url = url

    def export(self, trace: Trace) -> None:
        offset = self._offset
        context: Any = None
        if trace.traceparent:
            context = self._propagator.extract({"traceparent": trace.traceparent})
        times = [ns for _, ns in trace.timestamps]
        times += [ns for model in trace.models for _, ns in model.timestamps]
        if not times:
            return
        root = self._tracer.start_span(
            "InferRequest", context=context, kind=self._kind, start_time=min(times) + offset
        )
        for name, ns in sorted(trace.timestamps, key=lambda item: item[1]):
            root.add_event(name, timestamp=ns + offset)
        root_context = self._in_context(root, context)
        for model in trace.models:
            stamps = dict(model.timestamps)
            attributes: dict[str, Any] = {
                "triton.model_name": model.model_name,
                "triton.model_version": model.model_version,
                "triton.trace_id": trace.id,
                "triton.trace_parent_id": 0,
            }
            if model.request_id:
                attributes["triton.request_id"] = model.request_id
            span = self._tracer.start_span(
                model.model_name,
                context=root_context,
                kind=self._kind,
                start_time=stamps["REQUEST_START"] + offset,
                attributes=attributes,
            )
            for name, ns in model.timestamps:
                if name not in COMPUTE:
                    span.add_event(name, timestamp=ns + offset)
            if "COMPUTE_START" in stamps:
                compute = self._tracer.start_span(
                    "compute",
                    context=self._in_context(span, root_context),
                    kind=self._kind,
                    start_time=stamps["COMPUTE_START"] + offset,
                )
                for name in COMPUTE:
                    compute.add_event(name, timestamp=stamps[name] + offset)
                compute.end(end_time=stamps["COMPUTE_END"] + offset)
            span.end(end_time=stamps["REQUEST_END"] + offset)
        root.end(end_time=max(times) + offset)

    def shutdown(self) -> None:
        self._provider.shutdown()  # exports what is still batched
