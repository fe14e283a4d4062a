"""Bad requests get Triton's status and wording (4xx where Triton blames itself with a 500).
Texts recorded from Triton 2.51 in docs/triton-reference-behaviour.md. In process, through the
HTTP frontend's own seam (HttpTestClient): these are the frontend's rules, not the socket's; the
limits the protocol enforces and serving on after errors are in test_hostile_http.py."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from oceanus.frontends.http.testclient import HttpTestClient

PREFIX = "[request id: <id_unknown>] "
NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to "
    "be prepended to each input shape. If you want to specify the full shape including the "
    "batch dim in your input dims config, try setting max_batch_size to zero. See the model "
    "configuration docs for more info on max_batch_size."
)


def post(
    client: HttpTestClient, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], dict[str, Any]]:
    reply = client.post(path, body, headers)
    return reply.status, reply.headers, reply.json()


def simple_request(**overrides: Any) -> dict[str, Any]:
    inputs = [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
    ]
    for index, changes in overrides.get("inputs", {}).items():
        inputs[index] = {**inputs[index], **changes}
    document: dict[str, Any] = {"inputs": inputs}
    document.update({k: v for k, v in overrides.items() if k != "inputs"})
    return document


CASES = [
    # (description, request document or raw body, status, exact error)
    ("malformed JSON", b'{"inputs": [', 400, None),
    (
        "JSON array",
        b"[]",
        400,
        "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'",
    ),
    (
        "missing inputs",
        b"{}",
        400,
        "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'",
    ),
    (
        "inputs not a list",
        {"inputs": {}},
        400,
        "Unable to parse 'inputs': attempt to access JSON non-array as array",
    ),
    (
        "input without name",
        simple_request(inputs={0: {"name": None}}),
        400,
        "Unable to parse 'name': attempt to access JSON non-string as string",
    ),
    (
        "negative shape",
        simple_request(inputs={0: {"shape": [-1, 16]}}),
        400,
        "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer",
    ),
    ("no data", simple_request(inputs={0: {"data": None}}) | {}, 400, None),
    (
        "unknown input",
        simple_request(inputs={0: {"name": "INPUTX"}}),
        400,
        "unexpected inference input 'INPUTX' for model 'simple'",
    ),
    (
        "missing input",
        {"inputs": simple_request()["inputs"][:1]},
        400,
        PREFIX + "expected 2 inputs but got 1 inputs for model 'simple'. Got input(s) ['INPUT0'], "
        "but missing required input(s) ['INPUT1']. Please provide all required input(s).",
    ),
    (
        "wrong datatype",
        simple_request(inputs={0: {"datatype": "FP32"}}),
        400,
        PREFIX + "inference input 'INPUT0' data-type is 'FP32', but model 'simple' expects 'INT32'",
    ),
    (
        "shape [1,17]",
        simple_request(inputs={0: {"shape": [1, 17], "data": list(range(17))}}),
        400,
        PREFIX + "unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got "
        "[1,17]. " + NOTE,
    ),
    (
        "batch too large",
        simple_request(
            inputs={i: {"shape": [9, 16], "data": [1] * 144} for i in range(2)},
        ),
        400,
        PREFIX + "inference request batch-size must be <= 8 for 'simple'",
    ),
    (
        "missing batch dimension",
        simple_request(inputs={0: {"shape": [16]}, 1: {"shape": [16]}}),
        400,
        PREFIX + "inference request batch-size must be <= 8 for 'simple'",
    ),
    (
        # Triton compares the inputs' first dimensions before the batch size against the limit
        # (asked of Triton 2.51: docs/triton-reference-behaviour.md, 16).
        "one input's batch too large",
        simple_request(inputs={0: {"shape": [9, 16], "data": [1] * 144}}),
        400,
        PREFIX + "input 'INPUT0' batch size does not match other inputs for 'simple'",
    ),
    (
        "element count",
        simple_request(inputs={0: {"data": list(range(15))}}),
        400,
        "Unable to parse 'data': Shape does not match true shape of 'data' field",
    ),
    (
        "strings for INT32",
        simple_request(inputs={0: {"data": ["a"] * 16}}),
        400,
        "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer",
    ),
    (
        "unknown output",
        simple_request(outputs=[{"name": "OUTPUTX"}]),
        400,
        "unexpected inference output 'OUTPUTX' for model 'simple'",
    ),
    (
        "id not a string",
        simple_request(id=5),
        400,
        "Unable to parse 'id': attempt to access JSON non-string as string",
    ),
    (
        "priority not unsigned",
        simple_request(parameters={"priority": "high"}),
        400,
        "Unable to parse 'priority': attempt to access JSON non-unsigned-integer as "
        "unsigned-integer",
    ),
    (
        "parameter of array type",
        simple_request(parameters={"x": [1]}),
        400,
        "parameter 'x' has invalid type. It should be either 'int', 'bool', or 'string'.",
    ),
]


@pytest.mark.parametrize("description, document, status, error", CASES, ids=[c[0] for c in CASES])
def test_bad_json_requests(
    http_client: HttpTestClient, description: str, document: Any, status: int, error: str | None
) -> None:
    if isinstance(document, dict) and description == "no data":
        del document["inputs"][0]["data"]
        error = (
            "Input must set only one of the following fields: 'data', 'binary_data_size' in "
            "'parameters', 'shared_memory_region' in 'parameters'. But no field is set"
        )
    body = document if isinstance(document, bytes) else orjson.dumps(document)
    got_status, headers, answer = post(http_client, "/v2/models/simple/infer", body)
    assert got_status == status
    assert headers["content-type"] == "application/json"
    if error is None:
        assert answer["error"].startswith("failed to parse the request JSON buffer: ")
    else:
        assert answer == {"error": error}


def binary_body(
    first_size: int = 64, extra: bytes = b"", data_bytes: int = 128
) -> tuple[bytes, str]:
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "INT32",
                    "shape": [1, 16],
                    "parameters": {"binary_data_size": first_size},
                },
                {
                    "name": "INPUT1",
                    "datatype": "INT32",
                    "shape": [1, 16],
                    "parameters": {"binary_data_size": 64},
                },
            ]
        }
    )
    return header + bytes(data_bytes) + extra, str(len(header))


def test_binary_body_too_short(http_client: HttpTestClient) -> None:
    body, size = binary_body(data_bytes=124)
    status, _, answer = post(
        http_client, "/v2/models/simple/infer", body, {"Inference-Header-Content-Length": size}
    )
    assert status == 400
    assert answer == {
        "error": "unexpected size for input 'INPUT1', expecting 4 additional "
        "bytes for model 'simple'"
    }


def test_binary_body_too_long(http_client: HttpTestClient) -> None:
    body, size = binary_body(extra=b"\0" * 4)
    status, _, answer = post(
        http_client, "/v2/models/simple/infer", body, {"Inference-Header-Content-Length": size}
    )
    assert status == 400
    assert answer == {"error": "unexpected additional input data for model 'simple'"}


def test_binary_size_not_matching_shape(http_client: HttpTestClient) -> None:
    body, size = binary_body(first_size=60, data_bytes=124)
    status, _, answer = post(
        http_client, "/v2/models/simple/infer", body, {"Inference-Header-Content-Length": size}
    )
    assert status == 400
    assert answer == {
        "error": PREFIX + "input byte size mismatch for input 'INPUT0' for model "
        "'simple'. Expected 64, got 60"
    }


@pytest.mark.parametrize("value", ["abc", "-5", "100000"])
def test_bad_header_length(http_client: HttpTestClient, value: str) -> None:
    body, _ = binary_body()
    status, _, answer = post(
        http_client, "/v2/models/simple/infer", body, {"Inference-Header-Content-Length": value}
    )
    assert status == 400
    if value == "abc":
        assert answer == {"error": "Unable to parse Inference-Header-Content-Length: 'abc'"}
    else:
        assert answer == {
            "error": f"inference header size should be in range (0, {len(body)}), got: {value}"
        }


def test_incomplete_bytes_element(http_client: HttpTestClient) -> None:
    blob = (100).to_bytes(4, "little") + b"ab"
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "BYTES",
                    "shape": [1, 1],
                    "parameters": {"binary_data_size": len(blob)},
                }
            ]
        }
    )
    status, _, answer = post(
        http_client,
        "/v2/models/identity_bytes/infer",
        header + blob,
        {"Inference-Header-Content-Length": str(len(header))},
    )
    assert status == 400
    assert answer == {
        "error": "incomplete string data for inference input 'INPUT0', expecting "
        "string of length 100 but only 2 bytes available"
    }


def test_fp16_json_in_and_out(http_client: HttpTestClient) -> None:
    document = {
        "inputs": [{"name": "INPUT0", "datatype": "FP16", "shape": [1, 2], "data": [1.0, 2.0]}]
    }
    status, _, answer = post(http_client, "/v2/models/identity_fp16/infer", orjson.dumps(document))
    assert status == 400
    assert answer == {
        "error": "receiving FP16 data via JSON is not supported. Please use the "
        "binary data format for input INPUT0"
    }
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP16",
                    "shape": [1, 2],
                    "parameters": {"binary_data_size": 4},
                }
            ]
        }
    )
    status, _, answer = post(
        http_client,
        "/v2/models/identity_fp16/infer",
        header + bytes(4),
        {"Inference-Header-Content-Length": str(len(header))},
    )
    assert status == 400
    assert answer == {
        "error": "sending FP16 data via JSON is not supported. Please use the "
        "binary data format for output"
    }


def test_unknown_model_and_version(http_client: HttpTestClient) -> None:
    body = orjson.dumps(simple_request())
    status, _, answer = post(http_client, "/v2/models/nonexistent/infer", body)
    assert (status, answer) == (
        404,
        {"error": "Request for unknown model: 'nonexistent' is not found"},
    )
    status, _, answer = post(http_client, "/v2/models/simple/versions/7/infer", body)
    assert (status, answer) == (
        404,
        {"error": "Request for unknown model: 'simple' version 7 is not found"},
    )
    status, _, answer = post(http_client, "/v2/models/simple/versions/abc/infer", body)
    assert (status, answer) == (404, {"error": "Not Found"})


def test_unsupported_content_encoding_is_501(http_client: HttpTestClient) -> None:
    status, headers, answer = post(
        http_client,
        "/v2/models/simple/infer",
        orjson.dumps(simple_request()),
        {"Content-Encoding": "br"},
    )
    assert status == 501
    assert answer == {"error": "Unsupported compression type"}
    assert headers["accept-encoding"] == "gzip, deflate"


def test_corrupt_gzip_body(http_client: HttpTestClient) -> None:
    status, _, answer = post(
        http_client, "/v2/models/simple/infer", b"not gzip at all", {"Content-Encoding": "gzip"}
    )
    assert status == 400
    assert answer["error"].startswith("failed to decompress the request body")


def test_stats_of_unknown_model_and_version(http_client: HttpTestClient) -> None:
    reply = http_client.get("/v2/models/nonexistent/stats")
    assert (reply.status, reply.json()) == (
        400,
        {"error": "requested model 'nonexistent' is not available"},
    )
    reply = http_client.get("/v2/models/simple/versions/7/stats")
    assert (reply.status, reply.json()) == (
        400,
        {"error": "requested model version is not available for model 'simple'"},
    )
    reply = http_client.get("/v2/models/nonexistent/ready")
    assert (reply.status, reply.json()) == (400, {"error": "Model version not ready"})


def test_load_unload_in_mode_none(http_client: HttpTestClient) -> None:
    status, _, answer = post(http_client, "/v2/repository/models/simple/unload", b"")
    assert status == 503
    assert answer == {"error": "explicit model load / unload is not allowed if polling is enabled"}


def test_unknown_paths_and_methods(http_client: HttpTestClient) -> None:
    assert raw(http_client, "GET", "/v2/foo")[0] == 404
    assert raw(http_client, "GET", "/foo")[0] == 404
    assert raw(http_client, "POST", "/v2/health/live")[0] == 405
    assert raw(http_client, "GET", "/v2/models/simple/infer")[0] == 405
    assert raw(http_client, "DELETE", "/v2/models/simple")[0] == 405
    status, _, body = raw(http_client, "GET", "/v2/models/no_such_model")
    assert status == 404
    assert orjson.loads(body) == {
        "error": "Request for unknown model: 'no_such_model' is not found"
    }
    status, _, body = raw(http_client, "GET", "/v2/models/simple/versions/7")
    assert status == 404
    assert "version 7 is not found" in orjson.loads(body)["error"]


def test_strict_routing_like_triton(http_client: HttpTestClient) -> None:
    for path in (
        "/v2/",
        "/v2/models",
        "/v2/models/",
        "/v2/models/simple/",
        "/v2/health",
        "/v2/models/simple/versions/abc",
        "/v2/models/simple/versions/-1",
    ):
        status, _, body = raw(http_client, "GET", path)
        assert (status, orjson.loads(body)) == (404, {"error": "Not Found"}), path


def raw(
    client: HttpTestClient, method: str, path: str, body: bytes = b""
) -> tuple[int, dict[str, str], bytes]:
    reply = client.request(method, path, body)
    return reply.status, reply.headers, reply.body
