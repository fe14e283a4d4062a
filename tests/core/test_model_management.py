"""Model control modes, the repository API, reloads under traffic, auto-complete, draining."""

from __future__ import annotations

import base64
import http.client
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

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


@pytest.fixture
def repo(tmp_path: Path, model_repository: Path) -> Path:
    for name in ("simple", "simple_dyna", "identity_fp32", "slow_fp32"):
        shutil.copytree(model_repository / name, tmp_path / name)
    return tmp_path


def test_explicit_mode_load_and_unload(repo: Path, launch: Any) -> None:
    server = launch([repo], ["--model-control-mode=explicit", "--load-model=simple", *NO_SERVICES])
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


def test_load_with_config_override_and_files(repo: Path, launch: Any) -> None:
    server = launch([repo], ["--model-control-mode=explicit", *NO_SERVICES])
    client = httpclient.InferenceServerClient(server.http_url)
    config = client.get_model_repository_index()
    assert {"name": "simple"} in config
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
    onnx_file = (repo / "simple" / "1" / "model.onnx").read_bytes()
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


def test_reload_under_traffic_fails_no_request(repo: Path, launch: Any) -> None:
    server = launch([repo], ["--model-control-mode=explicit", "--load-model=*", *NO_SERVICES])
    stop = threading.Event()
    counts = {"ok": 0, "failed": 0}
    errors: list[str] = []

    def traffic() -> None:
        client = httpclient.InferenceServerClient(server.http_url)
        while not stop.is_set():
            try:
                simple_infer(client)
                counts["ok"] += 1
            except Exception as exc:  # every failure is counted and shown
                counts["failed"] += 1
                errors.append(str(exc))

    workers = [threading.Thread(target=traffic) for _ in range(4)]
    for worker in workers:
        worker.start()
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        for _ in range(3):
            time.sleep(0.3)
            client.load_model("simple_dyna")  # a reload: same files
    finally:
        time.sleep(0.3)
        stop.set()
        for worker in workers:
            worker.join()
    assert counts["failed"] == 0, errors[:3]
    assert counts["ok"] > 20


def test_unload_waits_for_requests_in_flight(repo: Path, launch: Any) -> None:
    server = launch([repo], ["--model-control-mode=explicit", "--load-model=*", *NO_SERVICES])
    outcome: dict[str, Any] = {}

    def slow_request() -> None:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        tensor = httpclient.InferInput("INPUT0", [1, 16], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
        try:
            outcome["result"] = client.infer("slow_fp32", [tensor]).as_numpy("OUTPUT0")
        except InferenceServerException as exc:
            outcome["error"] = exc

    threads = [threading.Thread(target=slow_request) for _ in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(0.05)
    assert request(server, "POST", "/v2/repository/models/slow_fp32/unload") == (200, None)
    for thread in threads:
        thread.join()
    assert "error" not in outcome
    assert np.array_equal(outcome["result"], np.ones((1, 16), np.float32))
    assert request(server, "GET", "/v2/models/slow_fp32") == (
        404,
        {"error": "Request for unknown model: 'slow_fp32' has no available versions"},
    )


def test_poll_mode_follows_the_repository(repo: Path, model_repository: Path, launch: Any) -> None:
    shutil.rmtree(repo / "identity_fp32")
    server = launch([repo], ["--model-control-mode=poll", "--repository-poll-secs=1", *NO_SERVICES])
    assert request(server, "POST", "/v2/repository/models/simple/load") == (
        503,
        {"error": "explicit model load / unload is not allowed if polling is enabled"},
    )

    def wait_for(predicate: Any, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.2)
        raise AssertionError(f"condition not met; index: {index(server)}")

    def ready(model: str) -> bool:
        return request(server, "GET", f"/v2/models/{model}/ready")[0] == 200

    shutil.copytree(model_repository / "identity_fp32", repo / "identity_fp32")
    wait_for(lambda: ready("identity_fp32"))

    shutil.rmtree(repo / "simple")
    wait_for(lambda: not ready("simple"))
    assert index(server)["simple"][0]["state"] == "UNAVAILABLE"

    config = repo / "simple_dyna" / "config.pbtxt"
    config.write_text(config.read_text().replace("max_batch_size: 8", "max_batch_size: 4"))
    wait_for(
        lambda: request(server, "GET", "/v2/models/simple_dyna/config")[1]["max_batch_size"] == 4
    )
    # a broken edit keeps the loaded version serving
    config.write_text("name: broken {")
    time.sleep(2.5)
    assert ready("simple_dyna")
    simple_infer(httpclient.InferenceServerClient(server.http_url))


def test_autocomplete_config_less_onnx_model(repo: Path, launch: Any) -> None:
    (repo / "simple" / "config.pbtxt").unlink()
    server = launch([repo], NO_SERVICES)
    status, config = request(server, "GET", "/v2/models/simple/config")
    assert status == 200
    assert config["platform"] == "onnxruntime_onnx"
    assert config["max_batch_size"] == 4  # all dims dynamic in front: Triton's default
    assert "dynamic_batching" in config
    assert [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]
    assert config["input"][0]["dims"] == [16]


def test_autocomplete_off_requires_the_config(repo: Path, launch: Any) -> None:
    (repo / "simple" / "config.pbtxt").unlink()
    server = launch(
        [repo], ["--disable-auto-complete-config", "--exit-on-error=false", *NO_SERVICES]
    )
    entries = index(server)
    assert entries["simple"][0]["state"] == "UNAVAILABLE"
    assert "config.pbtxt is required" in entries["simple"][0]["reason"]


def test_sigterm_drains_in_flight_requests(repo: Path, launch: Any) -> None:
    server = launch([repo], NO_SERVICES)
    outcome: dict[str, Any] = {}

    def slow_request() -> None:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        tensor = httpclient.InferInput("INPUT0", [1, 16], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
        outcome["result"] = client.infer("slow_fp32", [tensor]).as_numpy("OUTPUT0")

    thread = threading.Thread(target=slow_request)
    thread.start()
    time.sleep(0.05)
    assert server.stop() == 0
    thread.join()
    assert np.array_equal(outcome["result"], np.ones((1, 16), np.float32))
