"""The parts of pb_utils that reach into the server, end to end on real servers: custom metrics on
/metrics, response parameters on HTTP and gRPC, a model's is_ready() on the ready endpoints, and
the model loading API (load_model / unload_model / is_model_ready) in and out of explicit mode."""

from __future__ import annotations

import json
import queue
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from oceanus.core.observability.custom_metrics import CustomMetricRegistry, MetricError
from oceanus.frontends.metrics import TritonCollector
from oceanus.frontends.metrics.exposition import render
from tests.backends.python.conftest import copy_models

MODELS = ["custom_metrics", "loader", "init_loader", "ready_flag", "add_sub", "repeat"]
NOT_EXPLICIT = "explicit model load / unload is not allowed if polling is enabled"
LABELS = {"model": "custom_metrics", "version": "1"}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_models(tmp_path_factory.mktemp("api"), MODELS)


@pytest.fixture(scope="module")
def server(launch_module: Any, repository: Path) -> Any:
    return launch_module([repository])


@pytest.fixture(scope="module")
def explicit(launch_module: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    repository = copy_models(tmp_path_factory.mktemp("explicit"), MODELS)
    return launch_module([repository], ["--model-control-mode=explicit", "--load-model=loader"])


# ---- helpers ------------------------------------------------------------------------------------


def infer_json(
    server: Any, model: str, inputs: list[dict[str, Any]], **parameters: Any
) -> tuple[int, dict[str, Any]]:
    body: dict[str, Any] = {"inputs": inputs}
    if parameters:
        body["parameters"] = parameters
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/{model}/infer",
        data=json.dumps(body).encode(),
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def metrics_request(server: Any, x: float, action: str = "") -> dict[str, Any]:
    parameters = {"action": action} if action else {}
    status, body = infer_json(
        server,
        "custom_metrics",
        [{"name": "X", "datatype": "FP64", "shape": [1], "data": [x]}],
        **parameters,
    )
    assert status == 200, body
    return body


def output(body: dict[str, Any], name: str) -> Any:
    return next(o["data"] for o in body["outputs"] if o["name"] == name)


def scrape(server: Any) -> str:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def samples(text: str, family: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    for parsed in text_string_to_metric_families(text):
        if parsed.name == family:
            return {(s.name, frozenset(s.labels.items())): s.value for s in parsed.samples}
    return {}


def ready_status(server: Any, model: str) -> int:
    try:
        url = f"http://{server.http_url}/v2/models/{model}/ready"
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def wait_status(server: Any, model: str, wanted: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready_status(server, model) == wanted:
            return
        time.sleep(0.05)
    raise AssertionError(f"/v2/models/{model}/ready never answered {wanted}")


def loader(server: Any, action: str, name: str) -> tuple[bool, str]:
    status, body = infer_json(
        server,
        "loader",
        [
            {"name": "ACTION", "datatype": "BYTES", "shape": [1], "data": [action]},
            {"name": "NAME", "datatype": "BYTES", "shape": [1], "data": [name]},
        ],
    )
    assert status == 200, body
    return bool(output(body, "OK")[0]), str(output(body, "ERROR")[0])


# ---- custom metrics -----------------------------------------------------------------------------


def test_custom_metrics_reach_the_metrics_endpoint(server: Any) -> None:
    before = samples(scrape(server), "oceanus_test_requests")
    base = before.get(("oceanus_test_requests", frozenset(LABELS.items())), 0.0)
    for x in (2.0, 3.0, 7.0):
        body = metrics_request(server, x)
    assert output(body, "VALUES") == [base + 12.0, 7.0]  # value() reads the server's values

    for _ in range(2):  # values stay across scrapes
        text = scrape(server)
        assert "# HELP oceanus_test_requests Requests seen by the test model\n" in text
        assert "# TYPE oceanus_test_requests counter\n" in text
        assert (
            f'oceanus_test_requests{{model="custom_metrics",version="1"}} {base + 12:g}\n' in text
        )
        assert '# HELP oceanus_test_last The last "X"\\nseen\n' in text
        assert "# TYPE oceanus_test_last gauge\n" in text
        assert 'oceanus_test_last{kind="last",model="custom_metrics",version="1"} 7\n' in text
        assert "# TYPE oceanus_test_sizes histogram\n" in text
        histogram = samples(text, "oceanus_test_sizes")
        labels = frozenset(LABELS.items())
        counts = {
            le: histogram[("oceanus_test_sizes_bucket", labels | {("le", le)})]
            for le in ("1", "5", "10", "+Inf")
        }
        total = histogram[("oceanus_test_sizes_count", labels)]
        assert total >= 3 and histogram[("oceanus_test_sizes_sum", labels)] >= 12
        assert counts["+Inf"] == counts["10"] == total
        assert counts["5"] >= 2 and counts["1"] == 0
    # The custom families come after Triton's own.
    assert text.index("nv_inference_request_success") < text.index("oceanus_test_requests")


def test_refused_metric_operations_have_tritons_texts(server: Any) -> None:
    body = metrics_request(server, 1.0, "errors")
    assert output(body, "ERRORS") == [
        "Failed to increment metric value: TRITONSERVER_METRIC_KIND_COUNTER can only be "
        "incremented monotonically by non-negative values.",
        "Failed to set metric value: TRITONSERVER_METRIC_KIND_COUNTER does not support Set",
        "Failed to observe metric value: TRITONSERVER_METRIC_KIND_GAUGE does not support Observe",
        "Failed to get metric value: TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value",
        "Failed to increment metric value: TRITONSERVER_METRIC_KIND_HISTOGRAM does not support "
        "Increment",
        "Failed to create metric. Unexpected buckets found.",
        "Failed to create metric. Missing required buckets.",
        "Failed to create metric. Labels must be a dictionary.",
        "Error when creating MetricFamily: Invalid metric name",
        "Error when creating MetricFamily: Family name already exists with different type",
        "Failed to increment metric value: Invalid metric operation as the corresponding "
        "'MetricFamily' has been deleted. The 'MetricFamily' object should be deleted AFTER its "
        "corresponding 'Metric' objects have been deleted.",
    ]
    assert body["parameters"] == {"mode": "errors"}  # given as a JSON string
    assert "oceanus_test_orphan" not in scrape(server)  # deleted with its family


def test_deleted_family_leaves_the_endpoint(server: Any) -> None:
    metrics_request(server, 5.0)
    assert "oceanus_test_last{" in scrape(server)
    body = metrics_request(server, 0.0, "drop_gauge")
    assert output(body, "VALUES")[1] == -1.0
    text = scrape(server)
    assert "oceanus_test_last" not in text
    assert "oceanus_test_requests{" in text  # the others stay
    metrics_request(server, 0.0, "gauge")
    assert 'oceanus_test_last{kind="last",model="custom_metrics",version="1"} 0\n' in scrape(server)


def test_unloaded_models_metrics_leave_the_endpoint(explicit: Any) -> None:
    client = httpclient.InferenceServerClient(explicit.http_url)
    client.load_model("custom_metrics")
    metrics_request(explicit, 4.0)
    text = scrape(explicit)
    assert 'oceanus_test_requests{model="custom_metrics",version="1"} 4\n' in text
    client.unload_model("custom_metrics")
    assert "oceanus_test_" not in scrape(explicit)
    client.load_model("custom_metrics")  # a fresh start: the counter begins at zero again
    assert 'oceanus_test_requests{model="custom_metrics",version="1"} 0\n' in scrape(explicit)
    client.unload_model("custom_metrics")


def test_registry_shares_labels_between_owners_until_both_let_go() -> None:
    registry = CustomMetricRegistry()
    first, second = registry.owner(), registry.owner()
    first.new_family(1, "shared_total", "first description", "counter")
    second.new_family(1, "shared_total", "second description", "counter")
    first.new_metric(2, 1, {"b": "2", "a": "1"}, None)
    second.new_metric(2, 1, {"a": "1", "b": "2"}, None)
    first.update(2, "increment", 2)
    second.update(2, "increment", 3)
    first.update(2, "increment", -1)  # refused: counters only go up
    assert first.value(2) == second.value(2) == 5
    with pytest.raises(MetricError, match="Family name already exists with different type"):
        second.new_family(3, "shared_total", "d", "gauge")
    with pytest.raises(MetricError, match="Invalid label name"):
        first.new_metric(4, 1, {"bad-label": "x"}, None)
    first.new_family(5, "sizes", "d", "histogram")
    with pytest.raises(MetricError, match="strictly sorted"):
        first.new_metric(6, 5, {}, [5.0, 1.0])
    first.new_metric(6, 5, {}, [1.0, 5.0])
    for value in (0.5, 1.0, 3.0, 9.0):
        first.update(6, "observe", value)

    registry_text = CollectorRegistry(auto_describe=False)
    registry_text.register(TritonCollector(_NoModels(), custom=registry))  # type: ignore[arg-type]
    text = render(registry_text.collect()).decode()
    assert text == (
        "# HELP shared_total first description\n"
        "# TYPE shared_total counter\n"
        'shared_total{a="1",b="2"} 5\n'
        "# HELP sizes d\n"
        "# TYPE sizes histogram\n"
        "sizes_count 4\n"
        "sizes_sum 13.5\n"
        'sizes_bucket{le="1"} 2\n'
        'sizes_bucket{le="5"} 3\n'
        'sizes_bucket{le="+Inf"} 4\n'
    )
    first.close()
    assert [f.name for f in registry.snapshot()] == ["shared_total"]
    assert registry.snapshot()[0].samples[0].value == 5  # the second owner still holds it
    second.delete_family(1)
    assert registry.snapshot() == []


class _NoModels:
    models: dict[str, Any] = {}

    def ready_versions(self) -> list[Any]:
        return []


# ---- response parameters ------------------------------------------------------------------------


def test_response_parameters_over_http_and_grpc(server: Any) -> None:
    body = metrics_request(server, 1.0)
    assert set(body["parameters"]) == {"counter", "seen", "unit"}
    assert body["parameters"]["seen"] is True and body["parameters"]["unit"] == "requests"
    assert body["parameters"]["counter"] == int(output(body, "VALUES")[0])

    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = grpcclient.InferInput("X", [1], "FP64")
    x.set_data_from_numpy(np.array([1.0]))
    result = client.infer("custom_metrics", [x])
    parameters = result.get_response().parameters
    assert parameters["seen"].bool_param is True
    assert parameters["unit"].string_param == "requests"
    assert parameters["counter"].int64_param == int(result.as_numpy("VALUES")[0])

    http = httpclient.InferenceServerClient(server.http_url)
    hx = httpclient.InferInput("X", [1], "FP64")
    hx.set_data_from_numpy(np.array([1.0]))
    assert http.infer("custom_metrics", [hx]).get_response()["parameters"]["seen"] is True


def test_decoupled_response_parameters_on_the_grpc_stream(server: Any) -> None:
    received: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: received.put(error or result))
    n = grpcclient.InferInput("N", [1], "INT32")
    n.set_data_from_numpy(np.array([3], dtype=np.int32))
    try:
        client.async_stream_infer("repeat", [n], enable_empty_final_response=True)
    finally:
        client.stop_stream()
        client.close()
    results = [received.get_nowait() for _ in range(received.qsize())]
    parameters = [r.get_response().parameters for r in results]
    assert [p["index"].int64_param for p in parameters[:3]] == [0, 1, 2]
    assert [p["triton_final_response"].bool_param for p in parameters] == [
        False,
        False,
        False,
        True,
    ]
    assert "index" not in parameters[3]  # the empty final response


def test_plain_responses_have_no_parameters(server: Any) -> None:
    status, body = infer_json(
        server,
        "ready_flag",
        [{"name": "X", "datatype": "INT32", "shape": [1], "data": [3]}],
    )
    assert status == 200 and "parameters" not in body


# ---- is_ready -----------------------------------------------------------------------------------


def test_user_is_ready_feeds_model_readiness(server: Any, repository: Path) -> None:
    flag = repository / "ready_flag" / "flag"
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    assert ready_status(server, "ready_flag") == 200
    assert grpc.is_model_ready("ready_flag")
    try:
        for how, logged in [
            ("false", None),
            ("raise", "is_ready() failed: RuntimeError: dependency is down"),
            ("int", "is_ready() failed: is_ready() must return a boolean value"),
        ]:
            flag.write_text(how)
            wait_status(server, "ready_flag", 400)
            assert not grpc.is_model_ready("ready_flag")
            if logged is not None:
                assert logged in server.log()
            # Readiness is what the endpoints report: inference and server health go on.
            status, body = infer_json(
                server,
                "ready_flag",
                [{"name": "X", "datatype": "INT32", "shape": [1], "data": [5]}],
            )
            assert status == 200 and output(body, "Y") == [5]
            assert ready_status(server, "add_sub") == 200
            with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready") as response:
                assert response.status == 200
            flag.unlink()
            wait_status(server, "ready_flag", 200)
    finally:
        flag.unlink(missing_ok=True)
    assert grpc.is_model_ready("ready_flag")


# ---- model loading API --------------------------------------------------------------------------


def test_model_loading_api_needs_explicit_mode(server: Any) -> None:
    assert loader(server, "load", "add_sub") == (False, f"Failed to load model: {NOT_EXPLICIT}")
    assert loader(server, "unload", "add_sub") == (
        False,
        f"Failed to unload model: {NOT_EXPLICIT}",
    )
    assert ready_status(server, "add_sub") == 200  # nothing happened to it
    status, body = infer_json(
        server, "init_loader", [{"name": "X", "datatype": "INT32", "shape": [1], "data": [0]}]
    )
    assert status == 200 and output(body, "RESULT") == [f"Failed to load model: {NOT_EXPLICIT}"]
    assert loader(server, "ready", "add_sub") == (True, "")
    assert loader(server, "ready", "no_such_model") == (False, "")
    assert loader(server, "ready_bad_version", "add_sub") == (
        False,
        "Failed to check model readiness: failed to get model version from specified version "
        "string 'abc' (details: stol), version should be an integral value > 0",
    )


def test_load_and_unload_from_execute(explicit: Any) -> None:
    assert ready_status(explicit, "add_sub") == 400
    assert loader(explicit, "ready", "add_sub") == (False, "")
    assert loader(explicit, "load", "add_sub") == (True, "")
    assert ready_status(explicit, "add_sub") == 200
    assert loader(explicit, "ready", "add_sub") == (True, "")
    status, body = infer_json(
        explicit,
        "add_sub",
        [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]},
            {"name": "INPUT1", "datatype": "FP32", "shape": [1, 4], "data": [1, 1, 1, 1]},
        ],
    )
    assert status == 200 and output(body, "OUTPUT0") == [2, 3, 4, 5]

    assert loader(explicit, "load_config", "add_sub") == (True, "")
    config = httpclient.InferenceServerClient(explicit.http_url).get_model_config("add_sub")
    assert config["instance_group"][0]["count"] == 2

    assert loader(explicit, "unload", "add_sub") == (False, "")  # is_model_ready afterwards
    assert ready_status(explicit, "add_sub") == 400

    ok, error = loader(explicit, "load", "no_such_model")
    assert not ok and error.startswith("Failed to load model: failed to load 'no_such_model'")


def test_load_with_files_from_execute(explicit: Any) -> None:
    assert loader(explicit, "load_files", "doubler") == (True, "")
    status, body = infer_json(
        explicit, "doubler", [{"name": "X", "datatype": "INT32", "shape": [1], "data": [21]}]
    )
    assert status == 200 and output(body, "Y") == [42]
    assert loader(explicit, "unload", "doubler") == (False, "")


def test_load_from_initialize(explicit: Any) -> None:
    client = httpclient.InferenceServerClient(explicit.http_url)
    if ready_status(explicit, "add_sub") == 200:
        client.unload_model("add_sub")
    client.load_model("init_loader")  # its initialize() loads add_sub
    assert ready_status(explicit, "add_sub") == 200
    status, body = infer_json(
        explicit, "init_loader", [{"name": "X", "datatype": "INT32", "shape": [1], "data": [0]}]
    )
    assert status == 200 and output(body, "RESULT") == ["loaded"]
    client.unload_model("init_loader")
    client.unload_model("add_sub")
