"""The repository API over HTTP on a real server in explicit mode: index, load, unload, loads with
a config override and base64 files, with Triton's statuses and texts. The rules behind it
(reloads, unloads waiting for requests, poll mode, auto-complete) are tested in process:
tests/core/test_model_control_rules.py, tests/core/test_repository_rules.py."""

from __future__ import annotations

import base64
import http.client
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient

NO_SERVICES = ["--allow-grpc=false", "--allow-metrics=false"]


def request(server: Any, method: str, path: str, document: Any = None) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    body = orjson.dumps(document) if document is not None else None
    connection.request(method, path, body=body)
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, orjson.loads(data) if data else None


def index(server: Any) -> dict[str, list[dict[str, Any]]]:
    status, entries = request(server, "POST", "/v2/repository/index")
    assert status == 200
    by_name: dict[str, list[dict[str, Any]]] = {}
    for entry in entries:
        by_name.setdefault(entry["name"], []).append(entry)
    return by_name


def simple_infer(client: httpclient.InferenceServerClient, model: str = "simple_dyna") -> None:
    data = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    result = client.infer(model, inputs)
    assert np.array_equal(result.as_numpy("OUTPUT0"), data * 2)


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, model_repository: Path, launch_module: Any
) -> Any:
    repo = tmp_path_factory.mktemp("control")
    for name in ("simple", "identity_fp32"):
        shutil.copytree(model_repository / name, repo / name)
    return launch_module(
        [repo], ["--model-control-mode=explicit", "--load-model=simple", *NO_SERVICES]
    )


def test_explicit_mode_load_and_unload(server: Any) -> None:
    entries = index(server)
    assert entries["simple"] == [{"name": "simple", "version": "1", "state": "READY"}]
    assert entries["identity_fp32"] == [{"name": "identity_fp32"}]  # never loaded
    assert request(server, "GET", "/v2/models/identity_fp32/ready")[0] == 400

    assert request(server, "POST", "/v2/repository/models/identity_fp32/load") == (200, None)
    assert request(server, "GET", "/v2/models/identity_fp32/ready")[0] == 200

    assert request(server, "POST", "/v2/repository/models/simple/unload") == (200, None)
    assert index(server)["simple"] == [
        {"name": "simple", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
    ]
    assert request(server, "GET", "/v2/models/simple/ready")[0] == 400
    status, answer = request(server, "POST", "/v2/repository/models/nonexistent/load")
    assert status == 400
    assert answer == {"error": "failed to load 'nonexistent', failed to poll from model repository"}
    # tritonclient's calls work the same
    client = httpclient.InferenceServerClient(server.http_url)
    client.load_model("simple")
    assert client.is_model_ready("simple")
    client.unload_model("identity_fp32")
    assert not client.is_model_ready("identity_fp32")


def test_load_with_config_override_and_files(server: Any, model_repository: Path) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    override = orjson.dumps(
        {
            "name": "simple",
            "platform": "onnxruntime_onnx",
            "max_batch_size": 4,
            "input": [
                {"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [16]},
                {"name": "INPUT1", "data_type": "TYPE_INT32", "dims": [16]},
            ],
            "output": [
                {"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [16]},
                {"name": "OUTPUT1", "data_type": "TYPE_INT32", "dims": [16]},
            ],
        }
    ).decode()
    client.load_model("simple", config=override)
    assert client.get_model_config("simple")["max_batch_size"] == 4

    # a model made only of uploaded files, under a name the repository does not have
    onnx_file = (model_repository / "simple" / "1" / "model.onnx").read_bytes()
    uploaded = override.replace('"simple"', '"uploaded"')
    client.load_model("uploaded", config=uploaded, files={"file:1/model.onnx": onnx_file})
    simple_infer(client, "uploaded")
    status, answer = request(
        server,
        "POST",
        "/v2/repository/models/other/load",
        {"parameters": {"file:1/model.onnx": base64.b64encode(onnx_file).decode()}},
    )
    assert status == 400
    assert "require the 'config' parameter" in answer["error"]
