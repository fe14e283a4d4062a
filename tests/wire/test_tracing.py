"""Trace output: Triton's JSON trace file written for traced requests over HTTP and gRPC.

Each test starts a real server with trace flags, sends requests with tritonclient, stops the
server (the main trace file is completed at shutdown, as in Triton) and reads the file back.
"""

from __future__ import annotations

import json
import queue
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from oceanus.core.observability.tracing import (
    LEVEL_TIMESTAMPS,
    MODE_TRITON,
    SettingUpdate,
    TraceConfig,
    TraceManager,
    TraceSettingError,
)

MODEL_EVENTS = [
    "REQUEST_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "REQUEST_END",
]


def simple_inputs(client: Any, offset: int = 0) -> list[Any]:
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = client.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(np.arange(offset, offset + 16, dtype=np.int32).reshape(1, 16))
        inputs.append(tensor)
    return inputs


def read_traces(path: Path) -> dict[int, list[dict[str, Any]]]:
    """The trace file's objects grouped by trace id, in file order."""
    traces: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for item in json.loads(path.read_text()):
        traces[item["id"]].append(item)
    return dict(traces)


def timestamps(items: list[dict[str, Any]]) -> dict[str, int]:
    found: dict[str, int] = {}
    for item in items:
        for stamp in item.get("timestamps", []):
            found[stamp["name"]] = stamp["ns"]
    return found


def header(items: list[dict[str, Any]]) -> dict[str, Any]:
    return next(item for item in items if "model_name" in item)


def wait_for(path: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.exists(), f"{path} was not written"


def trace_args(trace_file: Path, *extra: str) -> list[str]:
    return [
        f"--trace-config=triton,file={trace_file}",
        "--trace-config=level=TIMESTAMPS",
        "--trace-config=rate=1",
        *extra,
    ]


def test_http_and_grpc_requests_are_traced(
    launch: Any, model_repository: Path, tmp_path: Path
) -> None:
    trace_file = tmp_path / "trace.json"
    server = launch([model_repository], trace_args(trace_file))
    with httpclient.InferenceServerClient(server.http_url) as client:
        client.infer("simple", simple_inputs(httpclient), request_id="over-http")
    grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
    grpc_client.infer("simple", simple_inputs(grpcclient), request_id="over-grpc")
    # One request on a stream.
    responses: queue.Queue[Any] = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: responses.put((result, error)))
    grpc_client.async_stream_infer("simple", simple_inputs(grpcclient), request_id="streamed")
    result, error = responses.get(timeout=20)
    assert error is None and result.get_response().id == "streamed"
    grpc_client.stop_stream()
    grpc_client.close()
    assert server.stop() == 0

    traces = read_traces(trace_file)
    by_request = {header(items)["request_id"]: items for items in traces.values()}
    assert set(by_request) == {"over-http", "over-grpc", "streamed"}
    for request_id, items in by_request.items():
        first = header(items)
        assert first["model_name"] == "simple"
        assert first["model_version"] == 1  # a number in the file, as in Triton
        stamps = timestamps(items)
        model = [stamps[name] for name in MODEL_EVENTS]
        assert model == sorted(model), request_id
        assert stamps["INFER_RESPONSE_COMPLETE"] >= stamps["COMPUTE_END"]
        if request_id == "over-http":
            front = ["HTTP_RECV_START", "HTTP_RECV_END"]
            back = ["HTTP_SEND_START", "HTTP_SEND_END"]
        else:
            front = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END"]
            back = ["GRPC_SEND_START", "GRPC_SEND_END"]
        order = [stamps[name] for name in [*front, "REQUEST_START"]]
        assert order == sorted(order), request_id
        order = [stamps[name] for name in ["REQUEST_END", *back]]
        assert order == sorted(order), request_id
        # Triton's layout: the frontend's receive timestamps come before the model's header.
        names = [item["timestamps"][0]["name"] for item in items if "timestamps" in item]
        assert names[:2] == front


def test_count_writes_an_indexed_file_at_once(
    launch: Any, model_repository: Path, tmp_path: Path
) -> None:
    """trace_count 2: the third request is not traced, and the two traces are written to
    trace.json.0 while the server runs."""
    trace_file = tmp_path / "trace.json"
    server = launch([model_repository], trace_args(trace_file, "--trace-config=count=2"))
    with httpclient.InferenceServerClient(server.http_url) as client:
        for n in range(3):
            client.infer("simple", simple_inputs(httpclient), request_id=f"r{n}")
        indexed = Path(f"{trace_file}.0")
        wait_for(indexed)
        traces = read_traces(indexed)
        assert sorted(header(items)["request_id"] for items in traces.values()) == ["r0", "r1"]
        assert client.get_trace_settings()["trace_count"] == "0"
    server.stop()
    assert not trace_file.exists()  # nothing was left for the main file


def test_rate_and_log_frequency(launch: Any, model_repository: Path, tmp_path: Path) -> None:
    """rate 2 traces every second request; log_frequency 2 writes every 2 traces to a file."""
    trace_file = tmp_path / "trace.json"
    args = trace_args(trace_file, "--trace-config=rate=2", "--trace-config=triton,log-frequency=2")
    server = launch([model_repository], args)
    with httpclient.InferenceServerClient(server.http_url) as client:
        for n in range(8):
            client.infer("simple", simple_inputs(httpclient), request_id=f"r{n}")
    for index, expected in ((0, ["r1", "r3"]), (1, ["r5", "r7"])):
        path = Path(f"{trace_file}.{index}")
        wait_for(path)
        traces = read_traces(path)
        assert sorted(header(items)["request_id"] for items in traces.values()) == expected
    server.stop()
    assert not Path(f"{trace_file}.2").exists()


def test_tensors_and_per_model_settings(
    launch: Any, model_repository: Path, tmp_path: Path
) -> None:
    """Tracing only `simple` (a model setting), at level TENSORS as well."""
    trace_file = tmp_path / "trace.json"
    server = launch([model_repository], [f"--trace-config=triton,file={trace_file}"])
    with httpclient.InferenceServerClient(server.http_url) as client:
        client.update_trace_settings(
            model_name="simple",
            settings={"trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": "1"},
        )
        client.infer("simple", simple_inputs(httpclient, offset=3), request_id="mine")
        client.infer("simple_dyna", simple_inputs(httpclient), request_id="not-traced")
        assert client.get_trace_settings()["trace_level"] == ["OFF"]
    server.stop()
    traces = read_traces(trace_file)
    assert len(traces) == 1
    (items,) = traces.values()
    assert header(items)["request_id"] == "mine"
    tensors = {
        (item["activity"], item["tensor"]["name"]): item["tensor"]
        for item in items
        if "activity" in item
    }
    assert tensors[("TENSOR_QUEUE_INPUT", "INPUT0")] == {
        "name": "INPUT0",
        "data": ",".join(str(v) for v in range(3, 19)),
        "shape": "1,16",
        "dtype": "INT32",
    }
    output = tensors[("TENSOR_BACKEND_OUTPUT", "OUTPUT0")]  # simple: OUTPUT0 = INPUT0 + INPUT1
    assert output["data"] == ",".join(str(2 * v) for v in range(3, 19))
    assert output["dtype"] == "INT32" and output["shape"] == "1,16"


def test_untraced_requests_leave_no_file(
    launch: Any, model_repository: Path, tmp_path: Path
) -> None:
    trace_file = tmp_path / "trace.json"
    server = launch([model_repository], [f"--trace-config=triton,file={trace_file}"])
    with httpclient.InferenceServerClient(server.http_url) as client:
        client.infer("simple", simple_inputs(httpclient))
    server.stop()
    assert not trace_file.exists()


def test_settings_rules_in_process(tmp_path: Path) -> None:
    """TraceManager's setting rules without a server (no request is traced here)."""
    config = TraceConfig(level=LEVEL_TIMESTAMPS, rate=1, file=str(tmp_path / "t.json"))
    manager = TraceManager(config)
    try:
        assert manager.active and manager.mode == MODE_TRITON
        manager.update("m", SettingUpdate(rate=4))
        assert manager.document("m")["trace_rate"] == "4"
        manager.update("", SettingUpdate(count=1))
        trace = manager.sample("other")
        assert trace is not None and trace.id == 1
        assert manager.sample("other") is None  # the count is spent
        assert manager.document()["trace_count"] == "0"
        with pytest.raises(TraceSettingError, match="setting :trace count is 0"):
            manager.update("", SettingUpdate(rate=2))
        with pytest.raises(TraceSettingError, match="sample rate must be non-zero"):
            manager.update("", SettingUpdate(rate=0, count=-1))
        manager.update("", SettingUpdate(clear_count=True))
        assert manager.sample("other") is not None
    finally:
        manager.close()
