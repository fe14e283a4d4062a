"""Trace mode "opentelemetry": spans exported over OTLP/HTTP to a receiver the test runs.

The receiver is a plain HTTP server decoding the OTLP protobuf the SDK's exporter posts; the
server under test is the real one, started with Triton's `--trace-config` flags.
"""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

trace_service = pytest.importorskip(
    "opentelemetry.proto.collector.trace.v1.trace_service_pb2",
    reason="the opentelemetry extra (opentelemetry-exporter-otlp-proto-http) is not installed",
)

CLIENT_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN_ID = "00f067aa0ba902b7"


class Receiver(http.server.ThreadingHTTPServer):
    """Collects the spans of every OTLP/HTTP export request."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.spans: list[Any] = []
        self.resources: list[dict[str, str]] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1/traces"

    def wait_for(self, count: int, timeout: float = 20.0) -> list[Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.spans) >= count:
                    return list(self.spans)
            time.sleep(0.05)
        raise AssertionError(f"expected {count} spans, got {len(self.spans)}")


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        export = trace_service.ExportTraceServiceRequest.FromString(body)
        with self.server.lock:
            for resource_spans in export.resource_spans:
                attributes = {
                    a.key: a.value.string_value for a in resource_spans.resource.attributes
                }
                self.server.resources.append(attributes)
                for scope_spans in resource_spans.scope_spans:
                    self.server.spans.extend(scope_spans.spans)
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def infer(client: httpclient.InferenceServerClient, headers: dict[str, str] | None = None) -> None:
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
        inputs.append(tensor)
    client.infer("simple", inputs, request_id="otel-1", headers=headers)


def test_spans_continue_the_clients_trace(
    launch: Any, model_repository: Path, receiver: Receiver
) -> None:
    """rate=0: only requests that bring a W3C traceparent are traced (Triton's rule)."""
    server = launch(
        [model_repository],
        [
            "--trace-config=mode=opentelemetry",
            "--trace-config=level=TIMESTAMPS",
            "--trace-config=rate=0",
            f"--trace-config=opentelemetry,url={receiver.url}",
            "--trace-config=opentelemetry,resource=service.name=oceanus-test",
            "--trace-config=opentelemetry,bsp_schedule_delay=50",
        ],
    )
    with httpclient.InferenceServerClient(server.http_url) as client:
        settings = client.get_trace_settings()
        assert settings["trace_mode"] == "opentelemetry"
        assert settings["url"] == receiver.url
        assert "trace_file" not in settings and "log_frequency" not in settings
        infer(client)  # no traceparent: not traced at rate 0
        traceparent = f"00-{CLIENT_TRACE_ID}-{CLIENT_SPAN_ID}-01"
        infer(client, {"traceparent": traceparent})
    spans = receiver.wait_for(3)
    time.sleep(0.3)  # anything more would arrive within a schedule delay or two
    assert len(receiver.spans) == 3
    by_name = {span.name: span for span in spans}
    assert set(by_name) == {"InferRequest", "simple", "compute"}
    root, model, compute = by_name["InferRequest"], by_name["simple"], by_name["compute"]
    for span in spans:
        assert span.trace_id.hex() == CLIENT_TRACE_ID
    assert root.parent_span_id.hex() == CLIENT_SPAN_ID
    assert model.parent_span_id == root.span_id
    assert compute.parent_span_id == model.span_id
    attributes = {a.key: a.value for a in model.attributes}
    assert attributes["triton.model_name"].string_value == "simple"
    assert attributes["triton.model_version"].int_value == 1
    assert attributes["triton.request_id"].string_value == "otel-1"
    assert [e.name for e in root.events] == [
        "HTTP_RECV_START",
        "HTTP_RECV_END",
        "HTTP_SEND_START",
        "HTTP_SEND_END",
    ]
    assert [e.name for e in model.events][:2] == ["REQUEST_START", "QUEUE_START"]
    assert [e.name for e in compute.events] == [
        "COMPUTE_START",
        "COMPUTE_INPUT_END",
        "COMPUTE_OUTPUT_START",
        "COMPUTE_END",
    ]
    assert root.start_time_unix_nano <= model.start_time_unix_nano <= compute.start_time_unix_nano
    assert compute.end_time_unix_nano <= model.end_time_unix_nano <= root.end_time_unix_nano
    # Wall-clock times (OpenTelemetry's), not the monotonic ones of the trace file.
    assert abs(root.start_time_unix_nano - time.time_ns()) < 60e9
    assert receiver.resources[0]["service.name"] == "oceanus-test"
