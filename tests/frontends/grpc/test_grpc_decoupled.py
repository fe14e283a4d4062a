"""Decoupled models (0..N responses per request) over a real server: ModelStreamInfer relays
every response with Triton's `triton_final_response` marks; the one-response calls refuse them
with Triton's texts."""

from __future__ import annotations

import queue
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.backends.python.conftest import copy_models


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, launch_module: Any) -> Any:
    repository = copy_models(tmp_path_factory.mktemp("decoupled"), ["repeat", "add_sub"])
    return launch_module([repository], ["--allow-metrics=false"])


def repeat_input(n: int) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("N", [1], "INT32")
    tensor.set_data_from_numpy(np.array([n], dtype=np.int32))
    return [tensor]


def stream_responses(server: Any, requests: list[tuple[str, int, dict[str, Any]]]) -> list[Any]:
    """Send (id, n, extra infer args) on one stream; every callback result, in arrival order."""
    received: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: received.put(error or result))
    try:
        for request_id, n, extra in requests:
            client.async_stream_infer("repeat", repeat_input(n), request_id=request_id, **extra)
    finally:
        client.stop_stream()  # waits for the server to close the stream
        client.close()
    results = []
    while not received.empty():
        results.append(received.get_nowait())
    return results


def final_flag(result: Any) -> bool:
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


def test_stream_relays_every_response_marked_as_triton_marks_them(server: Any) -> None:
    results = stream_responses(server, [("a", 3, {})])
    assert [r.as_numpy("I").tolist() for r in results] == [[0], [1], [2]]
    assert all(r.get_response().id == "a" for r in results)
    # Without an empty final response the model's flag came alone and is not sent: every
    # response that did come says it was not the last.
    assert [final_flag(r) for r in results] == [False, False, False]


def test_empty_final_response_when_the_request_asks(server: Any) -> None:
    results = stream_responses(server, [("b", 2, {"enable_empty_final_response": True})])
    assert [final_flag(r) for r in results] == [False, False, True]
    assert results[-1].get_response().outputs == []
    assert results[-1].get_response().id == "b"


def test_requests_interleave_on_one_stream(server: Any) -> None:
    results = stream_responses(server, [("x", 2, {}), ("y", 0, {}), ("z", 1, {})])
    by_id: dict[str, list[int]] = {}
    for result in results:
        by_id.setdefault(result.get_response().id, []).append(int(result.as_numpy("I")[0]))
    assert by_id == {"x": [0, 1], "z": [0]}


def test_error_response_is_in_band_and_the_stream_goes_on(server: Any) -> None:
    results = stream_responses(server, [("bad", -1, {}), ("good", 1, {})])
    errors = [r for r in results if isinstance(r, InferenceServerException)]
    assert len(errors) == 1 and "negative count" in errors[0].message()
    assert [r.as_numpy("I").tolist() for r in results if r not in errors] == [[0]]


def test_model_infer_refuses_a_decoupled_model(server: Any) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as info:
        client.infer("repeat", repeat_input(1))
    assert info.value.status() == str(grpc.StatusCode.UNIMPLEMENTED)
    assert info.value.message() == (
        "ModelInfer RPC doesn't support models with decoupled transaction policy"
    )


def test_http_refuses_a_decoupled_model(server: Any) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("N", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], dtype=np.int32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("repeat", [tensor])
    assert info.value.status() == "501"  # Triton: UNSUPPORTED -> 501 Not Implemented
    assert info.value.message() == (
        "HTTP end point doesn't support models with decoupled transaction policy"
    )
