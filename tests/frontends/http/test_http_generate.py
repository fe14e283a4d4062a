"""The generate extension (`/generate`, `/generate_stream` as server-sent events), compared with
what the reference Triton 2.51 answers for the same requests (docs/triton-reference-behaviour.md,
section 13), on real Python models (a decoupled one among them) and the ONNX `simple`."""

from __future__ import annotations

import http.client
import shutil
import socket
from pathlib import Path
from typing import Any

import orjson
import pytest

from oceanus.examples import example_repository

PYTHON_MODELS = Path(__file__).parents[2] / "backends" / "python" / "models"


@pytest.fixture(scope="module")
def server(launch_module: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    repository = tmp_path_factory.mktemp("generate-models")
    for name in ("repeat", "identity_bytes", "add_sub"):
        shutil.copytree(PYTHON_MODELS / name, repository / name)
    return launch_module([repository, example_repository(["simple"])], ["--allow-metrics=false"])


def post(server: Any, path: str, body: Any) -> tuple[int, str, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    connection.request("POST", path, body=data)
    response = connection.getresponse()
    payload = response.read()  # http.client undoes the chunked encoding
    connection.close()
    return response.status, response.getheader("content-type") or "", payload


def events(payload: bytes) -> list[Any]:
    assert payload.endswith(b"\n\n") or payload == b""
    chunks = [c for c in payload.split(b"\n\n") if c]
    assert all(c.startswith(b"data: ") for c in chunks)
    return [orjson.loads(c[len(b"data: ") :]) for c in chunks]


def test_generate_maps_json_keys_to_tensors_and_parameters(server: Any) -> None:
    status, kind, payload = post(
        server,
        "/v2/models/add_sub/generate",
        {"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1], "parameters": {"temperature": 0.5}},
    )
    assert (status, kind) == (200, "application/json")
    assert payload == (
        b'{"OUTPUT0":[2.0,3.0,4.0,5.0],"OUTPUT1":[0.0,1.0,2.0,3.0],'
        b'"model_name":"add_sub","model_version":"1"}'
    )
    # BYTES as text; a lone element as a scalar; the id comes back.
    status, _, payload = post(
        server, "/v2/models/identity_bytes/generate", {"id": "42", "INPUT0": "hello"}
    )
    assert orjson.loads(payload) == {
        "OUTPUT0": "hello",
        "id": "42",
        "model_name": "identity_bytes",
        "model_version": "1",
    }
    # An ONNX model with a batch dimension: 16 values become shape [1, 16].
    status, _, payload = post(
        server,
        "/v2/models/simple/versions/1/generate",
        {"INPUT0": list(range(16)), "INPUT1": [1] * 16},
    )
    document = orjson.loads(payload)
    assert status == 200
    assert document["OUTPUT0"] == [v + 1 for v in range(16)]
    assert document["OUTPUT1"] == [v - 1 for v in range(16)]


def test_generate_stream_sends_each_response_as_an_event(server: Any) -> None:
    status, kind, payload = post(server, "/v2/models/repeat/generate_stream", {"N": 3, "id": "g1"})
    assert (status, kind) == (200, "text/event-stream; charset=utf-8")
    assert events(payload) == [
        {"I": i, "id": "g1", "index": i, "model_name": "repeat", "model_version": "1"}
        for i in range(3)
    ]
    assert post(server, "/v2/models/repeat/generate_stream", {"N": 0})[:2] == (
        200,
        "text/event-stream; charset=utf-8",
    )
    assert events(post(server, "/v2/models/repeat/generate_stream", {"N": 0})[2]) == []
    # The first response's error sets the status; the error is an event.
    status, kind, payload = post(server, "/v2/models/repeat/generate_stream", {"N": -1})
    assert (status, kind) == (400, "text/event-stream; charset=utf-8")
    assert events(payload) == [{"error": "negative count"}]
    # A model that is not decoupled streams its one response.
    status, _, payload = post(
        server, "/v2/models/identity_bytes/generate_stream", {"INPUT0": ["a", "b"]}
    )
    assert events(payload)[0]["OUTPUT0"] == ["a", "b"]


def test_generate_needs_exactly_one_response(server: Any) -> None:
    assert orjson.loads(post(server, "/v2/models/repeat/generate", {"N": 1})[2])["I"] == 0
    status, _, payload = post(server, "/v2/models/repeat/generate", {"N": 3})
    # Triton answers 200 with this error (the status of the first response); Oceanus 500.
    assert status == 500
    assert orjson.loads(payload) == {
        "error": "generate expects model to produce exactly 1 response, use generate stream "
        "for model that generates various number of responses"
    }


@pytest.mark.parametrize(
    ("path", "body", "status", "error"),
    [
        (
            "add_sub/generate",
            {"INPUT0": [1, 2, 3], "INPUT1": [1, 1, 1, 1]},
            400,
            "The schema can not convert input 'INPUT0' to tensor with proper shape",
        ),
        (
            "add_sub/generate",
            {"INPUT0": [1, 2, 3, 4]},
            400,
            "[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model 'add_sub'. "
            "Got input(s) ['INPUT0'], but missing required input(s) ['INPUT1']. Please provide "
            "all required input(s).",
        ),
        (
            "add_sub/generate",
            {"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1], "extra": [1, 2]},
            400,
            "parameter 'extra' has invalid type. It should be either 'int', 'bool', or 'string'.",
        ),
        (
            "add_sub/generate_stream",
            {"INPUT0": [1, 2, 3, 4], "INPUT1": [1] * 4, "parameters": {"INPUT1": [2] * 4}},
            400,
            "Converting keyword: 'parameters': [request id: <id_unknown>] input 'INPUT1' "
            "already exists in request",
        ),
        ("nope/generate", {}, 404, "Request for unknown model: 'nope' is not found"),
    ],
)
def test_errors_before_inference_are_json(
    server: Any, path: str, body: Any, status: int, error: str
) -> None:
    assert post(server, f"/v2/models/{path}", body) == (
        status,
        "application/json",
        orjson.dumps({"error": error}),
    )


def test_client_leaving_a_stream_cancels_it_and_the_server_goes_on(server: Any) -> None:
    body = orjson.dumps({"N": 5000})
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        sock.sendall(
            b"POST /v2/models/repeat/generate_stream HTTP/1.1\r\nhost: x\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 OK")
    status, _, payload = post(server, "/v2/models/repeat/generate_stream", {"N": 2})
    assert status == 200 and len(events(payload)) == 2
