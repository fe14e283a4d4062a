"""`oceanus_in_process`: model.py on the server's instance threads, no stub (Oceanus's own mode).

The same test models as the stub mode, with the parameter added: outputs, BLS between two
in-process models, per-request errors and exceptions in Triton's texts, and what the mode
refuses."""

from __future__ import annotations

import json
import re
import urllib.request
from typing import Any

import pytest

from tests.backends.python.conftest import copy_models
from tests.backends.python.test_python_api import metrics_request, output, scrape
from tests.backends.python.test_python_models import post, x_request

IN_PROCESS = '\nparameters { key: "oceanus_in_process" value { string_value: "true" } }\n'
WHOAMI = """import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        pid = np.array([os.getpid()], dtype=np.int64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("PID", pid)]) for _ in requests]
"""
WHOAMI_CONFIG = """backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
"""


@pytest.fixture(scope="module")
def in_process_server(launch_module: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    repository = copy_models(
        tmp_path_factory.mktemp("in-process"),
        ["add_sub", "bls", "custom_metrics", "fail_some", "repeat"],
    )
    for name in ("whoami", "whoami_stub"):
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "1" / "model.py").write_text(WHOAMI)
        (repository / name / "config.pbtxt").write_text(WHOAMI_CONFIG)
    for name in ("add_sub", "bls", "custom_metrics", "fail_some", "repeat", "whoami"):
        with open(repository / name / "config.pbtxt", "a") as config:
            config.write(IN_PROCESS)
    return launch_module([repository], ["--exit-on-error=false"])


def pid_of(server: Any, model: str) -> int:
    status, body = post(server, f"/v2/models/{model}/infer", x_request(0, "INT64", (1,)))
    assert status == 200, body
    return int(body["outputs"][0]["data"][0])


def test_model_runs_in_the_server_process(in_process_server: Any) -> None:
    assert pid_of(in_process_server, "whoami") == in_process_server.process.pid
    assert pid_of(in_process_server, "whoami_stub") != in_process_server.process.pid


def test_add_sub(in_process_server: Any) -> None:
    a = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}
    b = {"name": "INPUT1", "datatype": "FP32", "shape": [1, 4], "data": [1, 1, 1, 1]}
    status, body = post(in_process_server, "/v2/models/add_sub/infer", {"inputs": [a, b]})
    assert status == 200, body
    outputs = {o["name"]: o["data"] for o in body["outputs"]}
    assert outputs == {"OUTPUT0": [2, 3, 4, 5], "OUTPUT1": [0, 1, 2, 3]}


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_bls_between_in_process_models(in_process_server: Any, mode: str) -> None:
    a = {"name": "A", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}
    m = {"name": "MODE", "datatype": "BYTES", "shape": [1], "data": [mode]}
    status, body = post(in_process_server, "/v2/models/bls/infer", {"inputs": [a, m]})
    assert status == 200, body
    assert {o["name"]: o["data"] for o in body["outputs"]}["SUM"] == [2, 4, 6, 8]
    m["data"] = ["missing"]
    assert post(in_process_server, "/v2/models/bls/infer", {"inputs": [a, m]}) == (
        500,
        {
            "error": "Model no_such_model - Error when running inference: Failed for execute "
            "the inference request. Model 'no_such_model' is not ready."
        },
    )


def test_errors_as_in_a_stub(in_process_server: Any) -> None:
    path = "/v2/models/fail_some/infer"
    assert post(in_process_server, path, x_request(-1)) == (
        500,
        {"error": "custom failure from model"},
    )
    assert post(in_process_server, path, x_request(-2)) == (404, {"error": "not found here"})
    status, body = post(in_process_server, path, x_request(13))
    assert status == 500
    assert re.fullmatch(
        r"Failed to process the request\(s\) for model 'fail_some_0', message: ValueError: "
        r"exception raised in execute\n\nAt:\n  /\S+/fail_some/1/model\.py\(\d+\): execute\n",
        body["error"],
    ), body["error"]
    status, body = post(in_process_server, path, x_request(7))
    assert body["error"].startswith(
        "Failed to process the request(s) for model 'fail_some_0', message: Number of "
        "InferenceResponse objects do not match"
    )


def test_decoupled_models_are_refused(in_process_server: Any) -> None:
    request = urllib.request.Request(
        f"http://{in_process_server.http_url}/v2/repository/index", data=b"{}", method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        index = {entry["name"]: entry for entry in json.loads(response.read())}
    assert index["repeat"]["state"] == "UNAVAILABLE"
    assert index["repeat"]["reason"] == (
        "model 'repeat': parameter 'oceanus_in_process' does not support decoupled models"
    )
    assert index["add_sub"]["state"] == "READY"


def test_custom_metrics(in_process_server: Any) -> None:
    assert output(metrics_request(in_process_server, 2.0), "VALUES") == [2.0, 2.0]
    body = metrics_request(in_process_server, 3.0)
    assert output(body, "VALUES") == [5.0, 3.0]
    assert body["parameters"] == {"counter": 5, "seen": True, "unit": "requests"}
    text = scrape(in_process_server)
    assert 'oceanus_test_requests{model="custom_metrics",version="1"} 5\n' in text
    assert 'oceanus_test_last{kind="last",model="custom_metrics",version="1"} 3\n' in text
    # The gauge family garbage-collected in the model leaves the endpoint.
    assert output(metrics_request(in_process_server, 0.0, "drop_gauge"), "VALUES") == [5.0, -1.0]
    assert "oceanus_test_last" not in scrape(in_process_server)
