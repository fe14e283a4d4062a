"""The last wire differences from Triton 2.51 a client could notice (issue 19), answered as the
real Triton answered them (docs/triton-reference-behaviour.md, section 16), over HTTP and gRPC:
request parameters named `triton_*`, a bad request for a model that does not exist, and inputs
the model does not have."""

from __future__ import annotations

import http.client
import math
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import orjson
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from tests.backends.python.conftest import copy_models

RESERVED_HTTP = (
    "parameter keys starting with 'triton_' are reserved for Triton usage and should not be "
    "specified."
)
RESERVED_GRPC = (
    "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following "
    "keys starting with 'triton_' are allowed: triton_enable_empty_final_response"
)
UNKNOWN = "Request for unknown model: 'nosuch' is not found"
PREFIX = "[request id: <id_unknown>] "


@pytest.fixture(scope="module")
def server(
    model_repository: Path, tmp_path_factory: pytest.TempPathFactory, launch_module: Any
) -> Any:
    decoupled = copy_models(tmp_path_factory.mktemp("decoupled"), ["repeat"])
    return launch_module([model_repository, decoupled], ["--allow-metrics=false"])


def post(server: Any, path: str, body: bytes, headers: dict[str, str] | None = None) -> Any:
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    try:
        connection.request("POST", path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, orjson.loads(response.read())
    finally:
        connection.close()


def tensor(name: str, shape: tuple[int, ...] = (1, 16)) -> dict[str, Any]:
    return {"name": name, "datatype": "INT32", "shape": list(shape), "data": [1] * math.prod(shape)}


GOOD = [tensor("INPUT0"), tensor("INPUT1")]

HTTP_CASES = [
    # (description, path, body, headers, status, error)
    ("triton_ key", "simple", {"parameters": {"triton_x": 1}, "inputs": GOOD}, 400, RESERVED_HTTP),
    (
        # gRPC's one allowed key is refused over HTTP too
        "triton_enable_empty_final_response",
        "simple",
        {"parameters": {"triton_enable_empty_final_response": True}, "inputs": GOOD},
        400,
        RESERVED_HTTP,
    ),
    ("triton_ key, null value", "simple", {"parameters": {"triton_x": None}}, 400, RESERVED_HTTP),
    (
        "triton_ key before bad inputs",
        "simple",
        {"parameters": {"triton_x": 1}, "inputs": 3},
        400,
        RESERVED_HTTP,
    ),
    (
        "bad priority before a triton_ key",
        "simple",
        {"parameters": {"priority": -1, "triton_x": 1}},
        400,
        "Unable to parse 'priority': attempt to access JSON non-unsigned-integer as "
        "unsigned-integer",
    ),
    (
        "sequence_start not a boolean",
        "simple",
        {"parameters": {"sequence_start": "x"}, "inputs": GOOD},
        400,
        "Unable to parse 'sequence_start': attempt to access JSON non-boolean as boolean",
    ),
    (
        "sequence_id an array",
        "simple",
        {"parameters": {"sequence_id": [1]}, "inputs": GOOD},
        400,
        "Unable to parse 'sequence_id': attempt to access JSON non-string as string",
    ),
    ("unknown model, malformed JSON", "nosuch", b"{not json", 404, UNKNOWN),
    ("unknown model, empty body", "nosuch", b"", 404, UNKNOWN),
    ("unknown model, JSON array", "nosuch", b"[]", 404, UNKNOWN),
    (
        "unknown version, malformed JSON",
        "simple/versions/7",
        b"{not json",
        404,
        "Request for unknown model: 'simple' version 7 is not found",
    ),
    (
        "decoupled model, malformed JSON",
        "repeat",
        b"{not json",
        501,
        "HTTP end point doesn't support models with decoupled transaction policy",
    ),
    (
        "unknown input in place of one",
        "simple",
        {"inputs": [tensor("INPUT0"), tensor("INPUTX")]},
        400,
        "unexpected inference input 'INPUTX' for model 'simple'",
    ),
    (
        "unknown input beside both",
        "simple",
        {"inputs": [*GOOD, tensor("INPUTX")]},
        400,
        PREFIX + "expected 2 inputs but got 3 inputs for model 'simple'. Got input(s) "
        "['INPUTX','INPUT1','INPUT0'], but missing required input(s) ]. Please provide all "
        "required input(s).",
    ),
    (
        "unknown input alone",
        "simple",
        {"inputs": [tensor("INPUTX")]},
        400,
        PREFIX + "expected 2 inputs but got 1 inputs for model 'simple'. Got input(s) "
        "['INPUTX'], but missing required input(s) ['INPUT0','INPUT1']. Please provide all "
        "required input(s).",
    ),
    (
        "five unknown inputs, in Triton's hash order",
        "simple",
        {"inputs": [tensor(name) for name in "abcde"]},
        400,
        PREFIX + "expected 2 inputs but got 5 inputs for model 'simple'. Got input(s) "
        "['e','c','b','d','a'], but missing required input(s) ['INPUT0','INPUT1']. Please "
        "provide all required input(s).",
    ),
    (
        "unknown input before a batch too large",
        "simple",
        {"inputs": [tensor("INPUTX", (9, 16)), tensor("INPUT0", (9, 16))]},
        400,
        "unexpected inference input 'INPUTX' for model 'simple'",
    ),
    (
        "unknown output before unknown input",
        "simple",
        {"inputs": [tensor("INPUT0"), tensor("INPUTX")], "outputs": [{"name": "OUTX"}]},
        400,
        "unexpected inference output 'OUTX' for model 'simple'",
    ),
    (
        "repeated input",
        "simple",
        {"inputs": [tensor("INPUT0"), tensor("INPUT0"), tensor("INPUT1")]},
        400,
        PREFIX + "input 'INPUT0' already exists in request",
    ),
    (
        "two bad datatypes: Triton names the later",
        "simple",
        {
            "inputs": [
                {**tensor("INPUT0"), "datatype": "FP32"},
                {**tensor("INPUT1"), "datatype": "FP32"},
            ]
        },
        400,
        PREFIX + "inference input 'INPUT1' data-type is 'FP32', but model 'simple' expects 'INT32'",
    ),
]


@pytest.mark.parametrize(
    ("description", "model", "body", "status", "error"), HTTP_CASES, ids=[c[0] for c in HTTP_CASES]
)
def test_http_answers_as_triton(
    server: Any, description: str, model: str, body: Any, status: int, error: str
) -> None:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    assert post(server, f"/v2/models/{model}/infer", data) == (status, {"error": error})


@pytest.mark.parametrize(
    "headers", [{"Content-Encoding": "gzip"}, {"Content-Encoding": "br"}], ids=["gzip", "br"]
)
def test_unknown_model_is_looked_up_before_the_body_is_decoded(
    server: Any, headers: dict[str, str]
) -> None:
    assert post(server, "/v2/models/nosuch/infer", b"xx", headers) == (404, {"error": UNKNOWN})


def test_server_keeps_serving(server: Any) -> None:
    status, answer = post(server, "/v2/models/simple/infer", orjson.dumps({"inputs": GOOD}))
    assert status == 200
    assert answer["outputs"][0]["data"] == [2] * 16


def grpc_request(
    model: str = "simple",
    names: tuple[str, ...] = ("INPUT0", "INPUT1"),
    parameters: dict[str, Any] | None = None,
) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name=model)
    for name in names:
        message.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        message.raw_input_contents.append(np.ones(16, np.int32).tobytes())
    for key, value in (parameters or {}).items():
        if isinstance(value, bool):
            message.parameters[key].bool_param = value
        else:
            message.parameters[key].int64_param = value
    return message


GRPC_CASES = [
    # (description, request, status, details)
    ("triton_ key", grpc_request(parameters={"triton_x": 1}), "INVALID_ARGUMENT", RESERVED_GRPC),
    (
        "triton_ key, unknown model",
        grpc_request("nosuch", parameters={"triton_x": 1}),
        "NOT_FOUND",
        UNKNOWN,
    ),
    (
        "triton_ key, decoupled model",
        grpc_request("repeat", ("N",), {"triton_x": 1}),
        "UNIMPLEMENTED",
        "ModelInfer RPC doesn't support models with decoupled transaction policy",
    ),
    (
        "unknown input beside both",
        grpc_request(names=("INPUT0", "INPUT1", "INPUTX")),
        "INVALID_ARGUMENT",
        PREFIX + "expected 2 inputs but got 3 inputs for model 'simple'. Got input(s) "
        "['INPUTX','INPUT1','INPUT0'], but missing required input(s) ]. Please provide all "
        "required input(s).",
    ),
    (
        "unknown input in place of one",
        grpc_request(names=("INPUT0", "INPUTX")),
        "INVALID_ARGUMENT",
        "unexpected inference input 'INPUTX' for model 'simple'",
    ),
]


@pytest.mark.parametrize(
    ("description", "request_message", "code", "details"),
    GRPC_CASES,
    ids=[c[0] for c in GRPC_CASES],
)
def test_grpc_answers_as_triton(
    server: Any, description: str, request_message: Any, code: str, details: str
) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            stub.ModelInfer(request_message, timeout=10)
    assert (raised.value.code().name, raised.value.details()) == (code, details)


def test_grpc_stream_looks_the_model_up_first(server: Any) -> None:
    """On a stream the error comes back as a response, with the unknown model's words."""
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        message = grpc_request("nosuch", parameters={"triton_x": 1})
        responses = list(stub.ModelStreamInfer(iter([message]), timeout=10))
    assert [r.error_message for r in responses] == [UNKNOWN]
