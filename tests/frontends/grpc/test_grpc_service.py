"""Every GRPCInferenceService RPC besides inference, health checking, errors as HTTP has them."""

from __future__ import annotations

import http.client
from typing import Any

import grpc
import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
from grpc_testlib import grpc_error, unary
from tritonclient.grpc import service_pb2 as pb

from oceanus.examples import example_repository
from oceanus.frontends.grpc import health

HTTP_TO_GRPC = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 503: "UNAVAILABLE", 501: "UNIMPLEMENTED"}


def http_get(
    server: Any, path: str, method: str = "GET", body: bytes | None = None
) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    connection.request(method, path, body=body)
    response = connection.getresponse()
    data = response.read()
    return response.status, orjson.loads(data) if data else None


def test_live_and_ready(grpc_client: grpcclient.InferenceServerClient) -> None:
    assert grpc_client.is_server_live()
    assert grpc_client.is_server_ready()
    assert grpc_client.is_model_ready("simple")
    assert grpc_client.is_model_ready("simple", "1")
    assert not grpc_client.is_model_ready("no_such_model")
    assert not grpc_client.is_model_ready("simple", "7")


def test_model_version_must_be_an_integer(grpc_client: grpcclient.InferenceServerClient) -> None:
    status, message = grpc_error(lambda: grpc_client.get_model_metadata("simple", "one"))
    assert status == "INVALID_ARGUMENT"
    assert message == (
        "failed to get model version from specified version string 'one' (details: stol), "
        "version should be an integral value > 0"
    )
    status, _ = grpc_error(lambda: grpc_client.is_model_ready("simple", "one"))
    assert status == "INVALID_ARGUMENT"


def test_standard_health_check(grpc_channel: grpc.Channel) -> None:
    check = grpc_channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=health.HealthCheckResponse.FromString,
    )
    assert check(health.HealthCheckRequest(), timeout=10).status == health.SERVING
    assert check(health.HealthCheckRequest(service="inference"), timeout=10).status == (
        health.SERVING
    )


def test_server_metadata_matches_http(
    server: Any, grpc_client: grpcclient.InferenceServerClient
) -> None:
    metadata = grpc_client.get_server_metadata(as_json=True)
    status, expected = http_get(server, "/v2")
    assert status == 200
    assert metadata["name"] == expected["name"]
    assert metadata["version"] == expected["version"]
    assert metadata.get("extensions", []) == expected["extensions"]


def test_model_metadata_matches_http(
    server: Any, grpc_client: grpcclient.InferenceServerClient
) -> None:
    metadata = grpc_client.get_model_metadata("simple", as_json=True)
    _, expected = http_get(server, "/v2/models/simple")
    assert metadata["name"] == "simple"
    assert metadata["versions"] == expected["versions"]
    assert metadata["platform"] == expected["platform"]
    for kind in ("inputs", "outputs"):
        assert [
            {"name": t["name"], "datatype": t["datatype"], "shape": [int(d) for d in t["shape"]]}
            for t in metadata[kind]
        ] == expected[kind]


def test_model_config(server: Any, grpc_client: grpcclient.InferenceServerClient) -> None:
    response = grpc_client.get_model_config("simple")
    config = response.config
    _, expected = http_get(server, "/v2/models/simple/config")
    assert config.name == "simple"
    assert config.max_batch_size == expected["max_batch_size"]
    assert [t.name for t in config.input] == [t["name"] for t in expected["input"]]
    assert grpc_client.get_model_config("simple", as_json=True)["config"]["name"] == "simple"


def test_statistics(server: Any, grpc_client: grpcclient.InferenceServerClient) -> None:
    tensor = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 3), np.float32))
    before = grpc_client.get_inference_statistics("identity_fp32").model_stats[0]
    grpc_client.infer("identity_fp32", [tensor])
    after = grpc_client.get_inference_statistics("identity_fp32", "1").model_stats[0]
    assert after.name == "identity_fp32" and after.version == "1"
    assert after.inference_count == before.inference_count + 1
    assert after.inference_stats.success.count == before.inference_stats.success.count + 1
    everything = grpc_client.get_inference_statistics()
    assert {"simple", "identity_fp32"} <= {s.name for s in everything.model_stats}
    http_status, body = http_get(server, "/v2/models/no_such_model/stats")
    status, message = grpc_error(lambda: grpc_client.get_inference_statistics("no_such_model"))
    assert (status, message) == (HTTP_TO_GRPC[http_status], body["error"])
    assert "no_such_model" in message


def test_repository_index(server: Any, grpc_client: grpcclient.InferenceServerClient) -> None:
    index = grpc_client.get_model_repository_index()
    _, expected = http_get(server, "/v2/repository/index", "POST", b"{}")
    assert [(m.name, m.version, m.state) for m in index.models] == [
        (m["name"], m.get("version", ""), m.get("state", "")) for m in expected
    ]
    assert "simple" in {m.name for m in index.models}


def test_repository_name_is_not_supported(grpc_channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as info:
        unary(
            grpc_channel,
            "RepositoryIndex",
            pb.RepositoryIndexRequest(repository_name="other"),
            pb.RepositoryIndexResponse,
        )
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert info.value.details() == "'repository_name' specification is not supported"


def test_shared_memory_without_regions(grpc_client: grpcclient.InferenceServerClient) -> None:
    """No region registered: empty statuses, Triton's errors (the full extension is tested in
    tests/frontends/test_shared_memory.py)."""
    assert len(grpc_client.get_system_shared_memory_status().regions) == 0
    assert len(grpc_client.get_cuda_shared_memory_status().regions) == 0
    status, message = grpc_error(lambda: grpc_client.get_system_shared_memory_status("r"))
    assert (status, message) == ("NOT_FOUND", "Unable to find system shared memory region: 'r'")
    status, message = grpc_error(lambda: grpc_client.get_cuda_shared_memory_status("r"))
    assert (status, message) == ("NOT_FOUND", "Unable to find cuda shared memory region: 'r'")
    key = "/oceanus_test_no_such_key"
    assert grpc_error(lambda: grpc_client.register_system_shared_memory("r", key, 64)) == (
        "INVALID_ARGUMENT",
        f"Unable to open shared memory region: '{key}'",
    )
    # CUDA IPC is not available: registering fails as on Triton without a CUDA driver
    assert grpc_error(lambda: grpc_client.register_cuda_shared_memory("r", b"aGFuZGxl", 0, 64)) == (
        "INVALID_ARGUMENT",
        "failed to register shared memory region: invalid args",
    )
    grpc_client.unregister_system_shared_memory("r")  # unknown names are fine, as in Triton
    grpc_client.unregister_cuda_shared_memory()


def test_trace_settings_default_to_off(grpc_client: grpcclient.InferenceServerClient) -> None:
    settings = grpc_client.get_trace_settings(as_json=True)["settings"]
    assert {key: value["value"] for key, value in settings.items()} == {
        "trace_level": ["OFF"],
        "trace_rate": ["1000"],
        "trace_count": ["-1"],
        "log_frequency": ["0"],
        "trace_file": [""],
        "trace_mode": ["triton"],
    }


def test_log_settings_are_shared_with_http(
    server: Any, grpc_client: grpcclient.InferenceServerClient
) -> None:
    settings = grpc_client.get_log_settings(as_json=True)["settings"]
    assert settings["log_verbose_level"] == {"uint32_param": 0}
    assert settings["log_format"] == {"string_param": "default"}
    assert set(settings) == {
        "log_file",
        "log_info",
        "log_warning",
        "log_error",
        "log_verbose_level",
        "log_format",
    }
    try:
        changed = grpc_client.update_log_settings(
            {"log_verbose_level": 1, "log_format": "ISO8601"}, as_json=True
        )["settings"]
        assert changed["log_verbose_level"] == {"uint32_param": 1}
        status, body = http_get(server, "/v2/logging")
        assert status == 200
        assert (body["log_verbose_level"], body["log_format"]) == (1, "ISO8601")
        # Triton's errors; a refused request changes nothing
        assert grpc_error(lambda: grpc_client.update_log_settings({"log_info": None})) == (
            "INVALID_ARGUMENT",
            "expect boolean for 'log_info'",
        )
        assert grpc_error(lambda: grpc_client.update_log_settings({"log_format": "json"})) == (
            "INVALID_ARGUMENT",
            "invalid argument for log_format, got: json",
        )
        assert grpc_error(lambda: grpc_client.update_log_settings({"log_file": "x.log"})) == (
            "UNIMPLEMENTED",
            "log file location can not be updated through network protocol",
        )
        assert http_get(server, "/v2/logging")[1]["log_format"] == "ISO8601"
    finally:
        grpc_client.update_log_settings({"log_verbose_level": 0, "log_format": "default"})


def test_errors_match_http(server: Any, grpc_client: grpcclient.InferenceServerClient) -> None:
    status, body = http_get(server, "/v2/models/no_such_model")
    assert status == 404
    assert grpc_error(lambda: grpc_client.get_model_metadata("no_such_model")) == (
        "NOT_FOUND",
        body["error"],
    )
    status, body = http_get(server, "/v2/models/no_such_model/config")
    assert grpc_error(lambda: grpc_client.get_model_config("no_such_model")) == (
        "NOT_FOUND",
        body["error"],
    )
    # the same bad request over both protocols: same text, INVALID_ARGUMENT for HTTP 400
    request = {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 2, 3], "data": [1, 2, 3, 4, 5, 6]}
        ]
    }
    status, body = http_get(server, "/v2/models/identity_fp32/infer", "POST", orjson.dumps(request))
    assert status == 400
    tensor = grpcclient.InferInput("INPUT0", [1, 2, 3], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 2, 3), np.float32))
    assert grpc_error(lambda: grpc_client.infer("identity_fp32", [tensor])) == (
        "INVALID_ARGUMENT",
        body["error"],
    )


def test_unknown_method_is_unimplemented(grpc_channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as info:
        unary(grpc_channel, "NoSuchRpc", pb.ServerLiveRequest(), pb.ServerLiveResponse)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_restricted_protocol(launch: Any) -> None:
    server = launch(
        [example_repository(["simple"])],
        [
            "--grpc-restricted-protocol=inference,model-config:infer-key=secret",
            "--grpc-restricted-protocol=health:admin=yes",
            "--allow-metrics=false",
        ],
    )
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert grpc_error(lambda: client.get_model_config("simple")) == (
            "UNAVAILABLE",
            "This protocol is restricted, expecting header 'triton-grpc-protocol-infer-key'",
        )
        assert (
            client.get_model_config(
                "simple", headers={"triton-grpc-protocol-infer-key": "secret"}
            ).config.name
            == "simple"
        )
        status, _ = grpc_error(
            lambda: client.get_model_config(
                "simple", headers={"triton-grpc-protocol-infer-key": "wrong"}
            )
        )
        assert status == "UNAVAILABLE"
        tensors = []
        for name in ("INPUT0", "INPUT1"):
            tensor = grpcclient.InferInput(name, [1, 16], "INT32")
            tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
            tensors.append(tensor)
        status, _ = grpc_error(lambda: client.infer("simple", tensors))
        assert status == "UNAVAILABLE"
        result = client.infer(
            "simple", tensors, headers={"triton-grpc-protocol-infer-key": "secret"}
        )
        assert (result.as_numpy("OUTPUT0") == 2).all()
        assert grpc_error(client.is_server_live)[0] == "UNAVAILABLE"
        assert client.is_server_live(headers={"triton-grpc-protocol-admin": "yes"})
        # unrestricted groups need no header
        assert client.get_model_metadata("simple").name == "simple"
    finally:
        client.close()


def test_bad_restricted_protocol_flag_exits(model_repository: Any) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "oceanus",
            f"--model-repository={model_repository}",
            "--grpc-restricted-protocol=telepathy:k=v",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "unknown restricted protocol 'telepathy'" in result.stderr
