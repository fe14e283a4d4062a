"""The scheduling features' wire parts on a real server: the rate limiter's flags, header
forwarding over HTTP, gRPC and gRPC streams (the parameter text exactly as Triton 2.51's Python
backend shows it), and an ensemble whose last step is decoupled streamed over gRPC and
`generate_stream` (compared with Triton 2.51: docs/triton-reference-behaviour.md)."""

from __future__ import annotations

import json
import queue
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

sys.path.insert(0, str(Path(__file__).parent.parent / "wire"))
from scheduling_models import (
    PARAMS,
    PARAMS_CONFIG,
    write_python_model,
    write_repeat_ensemble,
    write_sleeper,
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, launch_module: Any) -> Any:
    repository = tmp_path_factory.mktemp("scheduling")
    write_sleeper(repository)
    write_python_model(repository, "params", PARAMS_CONFIG, PARAMS)
    write_repeat_ensemble(repository)
    return launch_module(
        [repository],
        [
            "--rate-limit=execution_count",
            "--rate-limit-resource=R1:1",
            "--http-header-forward-pattern=x-fwd.*",
            "--grpc-header-forward-pattern=x-fwd.*|triton_.*",
        ],
    )


def post(server: Any, path: str, document: dict[str, Any]) -> tuple[int, str]:
    request = urllib.request.Request(
        f"http://{server.http_url}{path}", data=json.dumps(document).encode(), method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_rate_limited_instances_take_turns(server: Any) -> None:
    client = httpclient.InferenceServerClient(server.http_url, concurrency=2)
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.ones(1, np.float32))
    handles = [client.async_infer("sleeper", [tensor]) for _ in range(2)]
    first, second = sorted(h.get_result().as_numpy("SPAN").tolist() for h in handles)
    assert second[0] >= first[1]  # one R1: the second instance waited for the first


def _int_input(module: Any) -> Any:
    tensor = module.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.ones(1, np.int32))
    return tensor


def test_http_headers_reach_the_model_as_parameters(server: Any) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    headers = {"X-Fwd-A": "1", "x-fwd-b": "two", "other": "no"}
    result = client.infer("params", [_int_input(httpclient)], headers=headers, parameters={"p": 5})
    # Triton's exact text: request parameters first, then headers as the client wrote them.
    assert result.as_numpy("OUT")[0].decode() == '{"p":5,"X-Fwd-A":"1","x-fwd-b":"two"}'
    # generate does not forward headers (as in Triton 2.51)
    status, body = post(server, "/v2/models/params/generate", {"IN": [1]})
    assert status == 200 and json.loads(body)["OUT"] == "{}"


def test_grpc_metadata_reaches_the_model_as_parameters(server: Any) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    headers = {"x-fwd-a": "1", "x-fwd-b": "two", "other": "no"}
    result = client.infer("params", [_int_input(grpcclient)], headers=headers, parameters={"p": 5})
    assert result.as_numpy("OUT")[0].decode() == '{"p":5,"x-fwd-a":"1","x-fwd-b":"two"}'
    # Triton 2.51 forwards triton_ names too when the pattern matches them.
    result = client.infer("params", [_int_input(grpcclient)], headers={"triton_x": "1"})
    assert result.as_numpy("OUT")[0].decode() == '{"triton_x":"1"}'
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(
        callback=lambda result, error: answers.put((result, error)), headers={"x-fwd-s": "str"}
    )
    try:
        client.async_stream_infer("params", [_int_input(grpcclient)])
        result, error = answers.get(timeout=30)
    finally:
        client.stop_stream()
    assert error is None and result.as_numpy("OUT")[0].decode() == '{"x-fwd-s":"str"}'


def test_decoupled_last_step_streams_over_grpc(server: Any) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    got: list[Any] = []
    try:
        tensor = grpcclient.InferInput("IN", [3], "INT32")
        tensor.set_data_from_numpy(np.array([1, 2, 3], np.int32))
        client.async_stream_infer("repeat_ensemble", [tensor], enable_empty_final_response=True)
        while True:
            result, error = answers.get(timeout=30)
            assert error is None, error
            final = result.get_response().parameters["triton_final_response"].bool_param
            out = result.as_numpy("OUT")
            got.append((None if out is None else out.tolist(), final))
            if final:
                break
    finally:
        client.stop_stream()
    assert got == [([2], False), ([3], False), ([4], False), (None, True)]  # as Triton


def test_decoupled_last_step_streams_over_generate_stream(server: Any) -> None:
    status, body = post(server, "/v2/models/repeat_ensemble/generate_stream", {"IN": [1, 2, 3]})
    events = [json.loads(line[len("data: ") :]) for line in body.split("\n") if line]
    assert status == 200
    assert [event["OUT"] for event in events] == [2, 3, 4]


def test_a_decoupled_ensemble_is_refused_one_response_calls(server: Any) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.ones(1, np.int32))
    with pytest.raises(InferenceServerException) as error:
        client.infer("repeat_ensemble", [tensor])
    assert error.value.status() == "501"
    assert "HTTP end point doesn't support models with decoupled transaction policy" in str(
        error.value
    )
    # Triton shows the ensemble as decoupled in its config.
    config = client.get_model_config("repeat_ensemble")
    assert config["model_transaction_policy"] == {"decoupled": True}
    stats = client.get_inference_statistics("repeat_ensemble")["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] >= 1
