"""Every HTTP endpoint other than infer, through tritonclient and raw HTTP."""

from __future__ import annotations

import http.client
from typing import Any

import orjson
import tritonclient.http as httpclient


def raw(
    server: Any,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    connection.request(method, path, body=body, headers=headers or {})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, data


def test_health(server: Any) -> None:
    assert raw(server, "GET", "/v2/health/live")[0] == 200
    assert raw(server, "GET", "/v2/health/ready")[0] == 200
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("simple")
    assert client.is_model_ready("simple", "1")
    assert not client.is_model_ready("simple", "7")
    assert not client.is_model_ready("no_such_model")


def test_server_metadata_lists_tritons_extensions(server: Any) -> None:
    status, headers, body = raw(server, "GET", "/v2")
    assert status == 200
    assert headers["content-type"] == "application/json"
    document = orjson.loads(body)
    assert document["name"] == "oceanus"
    assert "binary_tensor_data" in document["extensions"]
    assert "statistics" in document["extensions"]
    assert "system_shared_memory" in document["extensions"]
    # listed as Triton 2.51 lists it: its calls are answered (with Triton's errors, no CUDA IPC)
    assert "cuda_shared_memory" in document["extensions"]
    assert "classification" in document["extensions"]


def test_model_metadata(server: Any) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    metadata = client.get_model_metadata("simple")
    assert metadata == {
        "name": "simple",
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]},
            {"name": "INPUT1", "datatype": "INT32", "shape": [-1, 16]},
        ],
        "outputs": [
            {"name": "OUTPUT0", "datatype": "INT32", "shape": [-1, 16]},
            {"name": "OUTPUT1", "datatype": "INT32", "shape": [-1, 16]},
        ],
    }
    assert client.get_model_metadata("simple", "1") == metadata


def test_model_config_is_normalized_like_triton(server: Any) -> None:
    status, _, body = raw(server, "GET", "/v2/models/simple/config")
    assert status == 200
    config = orjson.loads(body)
    # key order and defaults as the reference Triton 2.51 prints them
    assert list(config)[:6] == [
        "name",
        "platform",
        "backend",
        "runtime",
        "version_policy",
        "max_batch_size",
    ]
    assert config["backend"] == "onnxruntime"
    assert config["version_policy"] == {"latest": {"num_versions": 1}}
    assert config["input"][0] == {
        "name": "INPUT0",
        "data_type": "TYPE_INT32",
        "format": "FORMAT_NONE",
        "dims": [16],
        "is_shape_tensor": False,
        "allow_ragged_batch": False,
        "optional": False,
        "is_non_linear_format_io": False,
    }
    # a declared group without a name is "<model>_<index>", as Triton names it
    assert config["instance_group"] == [
        {
            "name": "simple_0",
            "kind": "KIND_CPU",
            "count": 1,
            "gpus": [],
            "secondary_devices": [],
            "profile": [],
            "passive": False,
            "host_policy": "",
        }
    ]
    assert config["optimization"]["input_pinned_memory"] == {"enable": True}
    assert config["default_model_filename"] == "model.onnx"
    # dynamic_batching {} gets the max batch size as its preferred size, as in Triton
    dyna = orjson.loads(raw(server, "GET", "/v2/models/simple_dyna/config")[2])
    assert dyna["dynamic_batching"]["preferred_batch_size"] == [8]
    assert dyna["dynamic_batching"]["max_queue_delay_microseconds"] == 0
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.get_model_config("simple") == config


def test_statistics_layout(server: Any) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    stats = client.get_inference_statistics("identity_int8")
    (entry,) = stats["model_stats"]
    assert entry["name"] == "identity_int8"
    assert entry["version"] == "1"
    for key in ("last_inference", "inference_count", "execution_count"):
        assert isinstance(entry[key], int)
    assert set(entry["inference_stats"]) == {
        "success",
        "fail",
        "queue",
        "compute_input",
        "compute_infer",
        "compute_output",
        "cache_hit",
        "cache_miss",
    }
    assert "batch_stats" in entry
    everything = client.get_inference_statistics()
    names = {e["name"] for e in everything["model_stats"]}
    assert {"simple", "identity_int8"} <= names
    status, _, body = raw(server, "GET", "/v2/models/simple/versions/1/stats")
    assert status == 200 and orjson.loads(body)["model_stats"][0]["name"] == "simple"


def test_repository_index(server: Any) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    index = client.get_model_repository_index()
    simple = next(e for e in index if e["name"] == "simple")
    assert simple == {"name": "simple", "version": "1", "state": "READY"}
    status, _, body = raw(server, "POST", "/v2/repository/index", b'{"ready": true}')
    assert status == 200
    assert all(e["state"] == "READY" for e in orjson.loads(body))


def test_logging_extension_changes_settings_at_run_time(model_repository: Any, launch: Any) -> None:
    server = launch([model_repository], ["--allow-grpc=false", "--allow-metrics=false"])
    status, _, body = raw(server, "GET", "/v2/logging")
    assert status == 200
    assert orjson.loads(body) == {
        "log_file": "",
        "log_info": True,
        "log_warning": True,
        "log_error": True,
        "log_verbose_level": 0,
        "log_format": "default",
    }
    status, _, body = raw(server, "POST", "/v2/logging", b'{"log_verbose_level": 1}')
    assert status == 200
    assert orjson.loads(body)["log_verbose_level"] == 1
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.get_log_settings()["log_verbose_level"] == 1
    client.update_log_settings({"log_verbose_level": 0})
    assert client.get_log_settings()["log_verbose_level"] == 0
    assert "logging" in client.get_server_metadata()["extensions"]
