"""The trace extension's settings: `/v2[/models/<m>]/trace/setting` and gRPC TraceSetting.

Expected texts and statuses were recorded from the reference Triton 2.51 (same requests to both;
docs/triton-reference-behaviour.md, section 12), except where Triton answers a client's mistake
with 500: there Oceanus answers 400 with the same words.
"""

from __future__ import annotations

import http.client
from pathlib import Path
from typing import Any

import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

DEFAULTS = {
    "trace_level": ["OFF"],
    "trace_rate": "1000",
    "trace_count": "-1",
    "log_frequency": "0",
    "trace_mode": "triton",
}


def call(server: Any, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    data = body if isinstance(body, bytes) or body is None else orjson.dumps(body)
    connection.request(method, path, body=data)
    response = connection.getresponse()
    payload = response.read()
    connection.close()
    return response.status, orjson.loads(payload) if payload else None


@pytest.fixture(scope="module")
def traced(launch_module: Any, model_repository: Path, tmp_path_factory: Any) -> Any:
    """A server with a trace file but tracing off (the defaults otherwise)."""
    trace_file = tmp_path_factory.mktemp("trace") / "trace.json"
    server = launch_module([model_repository], [f"--trace-config=triton,file={trace_file}"])
    server.trace_file = str(trace_file)
    return server


def test_defaults_and_extension_listed(traced: Any) -> None:
    status, document = call(traced, "GET", "/v2/trace/setting")
    assert status == 200
    assert document == {**DEFAULTS, "trace_file": traced.trace_file}
    # A model without settings of its own shows the global ones.
    assert call(traced, "GET", "/v2/models/simple/trace/setting") == (200, document)
    assert "trace" in call(traced, "GET", "/v2")[1]["extensions"]


def test_model_settings_follow_the_global_ones_until_cleared(traced: Any) -> None:
    try:
        status, model = call(traced, "POST", "/v2/models/simple/trace/setting", {"trace_rate": "5"})
        assert status == 200
        assert model["trace_rate"] == "5" and model["trace_level"] == ["OFF"]
        assert call(traced, "GET", "/v2/trace/setting")[1]["trace_rate"] == "1000"
        # A global change reaches the fields the model did not set itself.
        status, world = call(
            traced, "POST", "/v2/trace/setting", {"trace_level": ["TIMESTAMPS"], "trace_count": "7"}
        )
        assert status == 200
        assert world["trace_level"] == ["TIMESTAMPS"] and world["trace_count"] == "7"
        model = call(traced, "GET", "/v2/models/simple/trace/setting")[1]
        assert model["trace_level"] == ["TIMESTAMPS"]
        assert model["trace_count"] == "7"
        assert model["trace_rate"] == "5"
        # Clearing the model's only own field: the model follows the global setting again.
        status, model = call(
            traced, "POST", "/v2/models/simple/trace/setting", {"trace_rate": None}
        )
        assert status == 200 and model["trace_rate"] == "1000"
        # Unknown level names change nothing, as in Triton.
        status, world = call(traced, "POST", "/v2/trace/setting", {"trace_level": ["LOUD"]})
        assert status == 200 and world["trace_level"] == ["TIMESTAMPS"]
    finally:
        call(traced, "POST", "/v2/trace/setting", {"trace_level": ["OFF"], "trace_count": None})
    assert call(traced, "GET", "/v2/trace/setting")[1] == {
        **DEFAULTS,
        "trace_file": traced.trace_file,
    }


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        (
            {"trace_file": "/tmp/x.json"},
            501,
            "trace file location can not be updated through network protocol",
        ),
        ({"trace_rate": "abc"}, 400, "Unable to parse 'trace_rate', got: abc"),
        (
            {"trace_rate": "99999999999"},
            400,
            "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], "
            "got: 99999999999",
        ),
        (
            {"trace_count": "-5"},
            400,
            "Unable to parse 'trace_count'. Expecting value >= -1, got:-5",
        ),
        (
            {"trace_level": ["OFF", "TIMESTAMPS"]},
            400,
            "Expect only one trace level 'OFF' is specified",
        ),
        # Triton answers these three with 500.
        ({"trace_rate": 1}, 400, "attempt to access JSON non-string as string"),
        ({"trace_level": "TIMESTAMPS"}, 400, "attempt to access JSON non-array as array"),
        (b"{bad", 400, None),
    ],
)
def test_bad_requests(traced: Any, body: Any, status: int, error: str | None) -> None:
    answer_status, answer = call(traced, "POST", "/v2/trace/setting", body)
    assert answer_status == status
    if error is None:
        assert answer["error"].startswith("failed to parse the request JSON buffer")
    else:
        assert answer == {"error": error}
    assert call(traced, "GET", "/v2/trace/setting")[1]["trace_rate"] == "1000"


def test_unknown_model_and_wrong_method(traced: Any) -> None:
    assert call(traced, "POST", "/v2/models/nope/trace/setting", {}) == (
        400,
        {"error": "Request for unknown model : nope"},
    )
    assert call(traced, "PUT", "/v2/trace/setting") == (405, {"error": "Method Not Allowed"})


def test_tracing_needs_a_file(server: Any) -> None:
    """The session server has no trace file: turning tracing on is refused, as in Triton."""
    status, answer = call(server, "POST", "/v2/trace/setting", {"trace_level": ["TIMESTAMPS"]})
    assert (status, answer) == (
        400,
        {"error": "Attempting to set invalid trace setting :trace file name is not given"},
    )
    assert call(server, "GET", "/v2/trace/setting")[1]["trace_level"] == ["OFF"]


def test_tritonclient_http_and_grpc_share_the_settings(traced: Any) -> None:
    http_client = httpclient.InferenceServerClient(traced.http_url)
    grpc_client = grpcclient.InferenceServerClient(traced.grpc_url)
    try:
        changed = grpc_client.update_trace_settings(
            model_name="simple", settings={"trace_rate": "3"}, as_json=True
        )
        assert changed["settings"]["trace_rate"] == {"value": ["3"]}
        assert changed["settings"]["trace_level"] == {"value": ["OFF"]}
        assert http_client.get_trace_settings(model_name="simple")["trace_rate"] == "3"
        assert http_client.get_trace_settings()["trace_rate"] == "1000"
        grpc_document = grpc_client.get_trace_settings(as_json=True)["settings"]
        assert {key: value["value"] for key, value in grpc_document.items()} == {
            key: value if isinstance(value, list) else [value]
            for key, value in http_client.get_trace_settings().items()
        }
        # An empty value list clears the field (gRPC's null).
        grpc_client.update_trace_settings(model_name="simple", settings={"trace_rate": []})
        assert http_client.get_trace_settings(model_name="simple")["trace_rate"] == "1000"
    finally:
        http_client.close()
        grpc_client.close()


def test_grpc_errors(traced: Any) -> None:
    client = grpcclient.InferenceServerClient(traced.grpc_url)
    try:
        cases = [
            ({"trace_file": "x"}, "", "StatusCode.UNIMPLEMENTED"),
            ({"trace_count": "-5"}, "Expecting value >= -1, got: -5", "INVALID_ARGUMENT"),
            ({"trace_rate": ["1", "2"]}, "expect only 1 value for 'trace_rate'", "INVALID"),
        ]
        for settings, text, status in cases:
            with pytest.raises(InferenceServerException) as info:
                client.update_trace_settings(settings=settings)
            assert status in str(info.value.status())
            assert text in str(info.value.message())
        with pytest.raises(InferenceServerException) as info:
            client.get_trace_settings(model_name="nope")
        assert info.value.message() == "Request for unknown model : nope"
    finally:
        client.close()


def test_grpc_raw_message(traced: Any) -> None:
    """A raw TraceSettingRequest, without tritonclient's conversions."""
    import grpc

    with grpc.insecure_channel(traced.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        response = stub.TraceSetting(pb.TraceSettingRequest(model_name="simple"), timeout=10)
    assert dict(response.settings)["trace_file"].value == [traced.trace_file]
    assert list(response.settings["trace_level"].value) == ["OFF"]
