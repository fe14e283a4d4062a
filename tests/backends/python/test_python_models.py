"""Python-backend models (model.py) served by a real server: execute, datatypes, auto-complete,
async execute, per-request errors versus exceptions, decoupled refusal on one-response calls,
BLS. Expected texts are Triton 2.51's (docs/triton-reference-behaviour.md, 5e)."""

from __future__ import annotations

import json
import re
import threading
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def post(server: Any, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"http://{server.http_url}{path}", data=json.dumps(body).encode(), method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def get(server: Any, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://{server.http_url}{path}", timeout=30) as response:
            body = response.read()
            return response.status, json.loads(body) if body else None
    except urllib.error.HTTPError as exc:
        body = exc.read()
        return exc.code, json.loads(body) if body else None


def x_request(
    value: int, datatype: str = "INT32", shape: tuple[int, ...] = (1, 1)
) -> dict[str, Any]:
    return {"inputs": [{"name": "X", "datatype": datatype, "shape": list(shape), "data": [value]}]}


def test_add_sub_http_and_grpc(python_server: Any) -> None:
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.ones((2, 4), dtype=np.float32)
    client = httpclient.InferenceServerClient(python_server.http_url)
    inputs = [
        httpclient.InferInput("INPUT0", [2, 4], "FP32"),
        httpclient.InferInput("INPUT1", [2, 4], "FP32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b, binary_data=False)
    result = client.infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)

    grpc = grpcclient.InferenceServerClient(python_server.grpc_url)
    ginputs = [
        grpcclient.InferInput("INPUT0", [2, 4], "FP32"),
        grpcclient.InferInput("INPUT1", [2, 4], "FP32"),
    ]
    ginputs[0].set_data_from_numpy(a)
    ginputs[1].set_data_from_numpy(b)
    outputs = [grpcclient.InferRequestedOutput("OUTPUT1")]
    gresult = grpc.infer("add_sub", ginputs, outputs=outputs)
    np.testing.assert_array_equal(gresult.as_numpy("OUTPUT1"), a - b)
    assert gresult.as_numpy("OUTPUT0") is None  # not requested, so not returned


def test_add_sub_metadata_and_config(python_server: Any) -> None:
    status, metadata = get(python_server, "/v2/models/add_sub")
    assert status == 200
    assert metadata["platform"] == "python"
    assert metadata["inputs"][0] == {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}
    status, config = get(python_server, "/v2/models/add_sub/config")
    assert config["backend"] == "python"
    assert config["default_model_filename"] == "model.py"
    assert config["instance_group"][0]["name"] == "add_sub"


def test_initialize_gets_tritons_args(python_server: Any) -> None:
    # add_sub logs its instance name through pb_utils.Logger from initialize().
    assert "add_sub initialized as add_sub_0" in python_server.log()


def test_batch_reaches_execute_as_requests(python_server: Any) -> None:
    """Requests queued together reach execute() as one list; each gets its own answer."""
    results: dict[int, tuple[int, dict[str, Any]]] = {}

    def send(value: int) -> None:
        results[value] = post(python_server, "/v2/models/fail_some/infer", x_request(value))

    threads = [threading.Thread(target=send, args=(v,)) for v in (1, 2, -1, 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for value in (1, 2, 3):
        assert results[value][0] == 200
        assert results[value][1]["outputs"][0]["data"] == [value]
    assert results[-1] == (500, {"error": "custom failure from model"})
    _status, stats = get(python_server, "/v2/models/fail_some/stats")
    model_stats = stats["model_stats"][0]
    # fail_some waits up to 200 ms to fill a batch: fewer executions than requests.
    assert model_stats["execution_count"] < model_stats["inference_count"]


@pytest.mark.parametrize("binary", [True, False])
def test_identity_every_datatype(python_server: Any, binary: bool) -> None:
    arrays: dict[str, np.ndarray] = {
        "FP32": np.array([[1.5, -2.0, 3.25]], dtype=np.float32),
        "FP16": np.array([[0.5, 1.0]], dtype=np.float16),
        "INT64": np.array([[2**40, -7]], dtype=np.int64),
        "UINT8": np.array([[0, 255, 7]], dtype=np.uint8),
        "BOOL": np.array([[True, False, True]], dtype=np.bool_),
        "BYTES": np.array([[b"hello", b"", b"\xff\x00binary", "wörld".encode()]], dtype=np.object_),
    }
    client = httpclient.InferenceServerClient(python_server.http_url)
    inputs = []
    for datatype, array in arrays.items():
        tensor = httpclient.InferInput(f"IN_{datatype}", list(array.shape), datatype)
        # JSON cannot carry FP16 or non-UTF-8 bytes
        tensor.set_data_from_numpy(array, binary_data=binary or datatype in ("FP16", "BYTES"))
        inputs.append(tensor)
    outputs = [httpclient.InferRequestedOutput(f"OUT_{d}", binary_data=True) for d in arrays]
    result = client.infer("identity", inputs, outputs=outputs)
    for datatype, array in arrays.items():
        got = result.as_numpy(f"OUT_{datatype}")
        assert got is not None
        assert got.shape == array.shape
        assert result.get_output(f"OUT_{datatype}")["datatype"] == datatype
        if datatype == "BYTES":
            assert got.tolist() == array.tolist()
        else:
            np.testing.assert_array_equal(got, array)


def test_identity_bytes_large_goes_through_spill(python_server: Any) -> None:
    """A tensor larger than the shared-memory ring travels through a one-off segment."""
    big = np.array([b"x" * (3 << 20), b"y" * (6 << 20), b"z"], dtype=np.object_)
    client = grpcclient.InferenceServerClient(python_server.grpc_url)
    tensor = grpcclient.InferInput("INPUT0", [3], "BYTES")
    tensor.set_data_from_numpy(big)
    for _ in range(3):
        result = client.infer("identity_bytes", [tensor])
        assert result.as_numpy("OUTPUT0").tolist() == big.tolist()


def test_auto_complete_config(python_server: Any) -> None:
    status, config = get(python_server, "/v2/models/autocomplete/config")
    assert status == 200
    assert config["backend"] == "python"
    assert config["max_batch_size"] == 4
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("X", "TYPE_INT32", [2])
    ]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [
        ("Y", "TYPE_INT32", [2])
    ]
    assert config["dynamic_batching"]["preferred_batch_size"] == [4]
    status, body = post(
        python_server,
        "/v2/models/autocomplete/infer",
        {"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 2], "data": [3, 4]}]},
    )
    assert status == 200
    assert body["outputs"][0]["data"] == [6, 8]


def test_async_execute(python_server: Any) -> None:
    status, body = post(
        python_server,
        "/v2/models/async_add/infer",
        {"inputs": [{"name": "X", "datatype": "INT64", "shape": [3], "data": [1, 2, 3]}]},
    )
    assert status == 200
    assert body["outputs"][0] == {"name": "Y", "datatype": "INT64", "shape": [3], "data": [2, 3, 4]}


def test_error_response_versus_exception(python_server: Any) -> None:
    before = get(python_server, "/v2/models/fail_some/stats")[1]["model_stats"][0]
    # InferenceResponse(error=TritonError(...)): that request's error, 500 by default ...
    assert post(python_server, "/v2/models/fail_some/infer", x_request(-1)) == (
        500,
        {"error": "custom failure from model"},
    )
    # ... or the status of the error's code
    assert post(python_server, "/v2/models/fail_some/infer", x_request(-2)) == (
        404,
        {"error": "not found here"},
    )
    # An exception in execute fails the whole batch, with the model's traceback.
    status, body = post(python_server, "/v2/models/fail_some/infer", x_request(13))
    assert status == 500
    assert re.fullmatch(
        r"Failed to process the request\(s\) for model 'fail_some_0', message: ValueError: "
        r"exception raised in execute\n\nAt:\n  /\S+/fail_some/1/model\.py\(\d+\): execute\n",
        body["error"],
    ), body["error"]
    status, body = post(python_server, "/v2/models/fail_some/infer", x_request(7))
    assert body["error"] == (
        "Failed to process the request(s) for model 'fail_some_0', message: Number of "
        "InferenceResponse objects do not match the number of InferenceRequest objects. "
        "InferenceRequest(s) size is:1, and InferenceResponse(s) size is:0\n"
    )
    after = get(python_server, "/v2/models/fail_some/stats")[1]["model_stats"][0]
    # As Triton counts them: error responses are successes, exceptions failures.
    assert (
        after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
        == 2
    )
    assert (
        after["inference_stats"]["fail"]["count"] - before["inference_stats"]["fail"]["count"] == 2
    )
    assert after["execution_count"] - before["execution_count"] == 4
    assert "exception raised in execute" in python_server.log()


def test_decoupled_model_refused_on_http(python_server: Any) -> None:
    status, body = post(
        python_server,
        "/v2/models/repeat/infer",
        {"inputs": [{"name": "N", "datatype": "INT32", "shape": [1], "data": [2]}]},
    )
    assert (status, body) == (
        501,
        {"error": "HTTP end point doesn't support models with decoupled transaction policy"},
    )


@pytest.mark.parametrize("mode", ["sync", "async", "stream"])
def test_bls(python_server: Any, mode: str) -> None:
    status, body = post(
        python_server,
        "/v2/models/bls/infer",
        {
            "inputs": [
                {"name": "A", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]},
                {"name": "MODE", "datatype": "BYTES", "shape": [1], "data": [mode]},
            ]
        },
    )
    assert status == 200, body
    outputs = {o["name"]: o["data"] for o in body["outputs"]}
    assert outputs["SUM"] == [2, 4, 6, 8]
    # repeat sends 3 responses, then the final flag alone, which a BLS caller gets as a 4th,
    # empty response (as from Triton 2.51)
    assert outputs["COUNT"] == [4 if mode == "stream" else 0]


def test_bls_error_comes_back_as_response_error(python_server: Any) -> None:
    status, body = post(
        python_server,
        "/v2/models/bls/infer",
        {
            "inputs": [
                {"name": "A", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]},
                {"name": "MODE", "datatype": "BYTES", "shape": [1], "data": ["missing"]},
            ]
        },
    )
    # Triton 2.51's text (its stub's request executor), recorded from the reference server
    assert (status, body) == (
        500,
        {
            "error": "Model no_such_model - Error when running inference: Failed for execute "
            "the inference request. Model 'no_such_model' is not ready."
        },
    )


def test_grpc_errors_keep_the_model_text(python_server: Any) -> None:
    client = grpcclient.InferenceServerClient(python_server.grpc_url)
    tensor = grpcclient.InferInput("X", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[-1]], dtype=np.int32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("fail_some", [tensor])
    assert info.value.message() == "custom failure from model"
    assert info.value.status() == "StatusCode.INTERNAL"
