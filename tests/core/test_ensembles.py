"""Ensemble models (platform "ensemble"): loading, validation, pipelines, fan-out, statistics."""

from __future__ import annotations

import http.client
import queue
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

NO_SERVICES = ["--allow-metrics=false"]

# simple twice: (A, B) -> (A+B, A-B) -> (2A, 2B); identity_int32 reads A+B too (fan-out).
PIPELINE = """
name: "pipeline"
platform: "ensemble"
max_batch_size: 8
input [
  { name: "A" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "B" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "TWICE_A" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "TWICE_B" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "SUM_COPY" data_type: TYPE_INT32 dims: [ 16 ] }
]
ensemble_scheduling {
  step [
    {
      model_name: "simple"
      model_version: -1
      input_map { key: "INPUT0" value: "A" }
      input_map { key: "INPUT1" value: "B" }
      output_map { key: "OUTPUT0" value: "sum" }
      output_map { key: "OUTPUT1" value: "diff" }
    },
    {
      model_name: "simple"
      model_version: 1
      input_map { key: "INPUT0" value: "sum" }
      input_map { key: "INPUT1" value: "diff" }
      output_map { key: "OUTPUT0" value: "TWICE_A" }
      output_map { key: "OUTPUT1" value: "TWICE_B" }
    },
    {
      model_name: "identity_int32"
      model_version: -1
      input_map { key: "INPUT0" value: "sum" }
      output_map { key: "OUTPUT0" value: "SUM_COPY" }
    }
  ]
}
"""


def request(server: Any, method: str, path: str) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    connection.request(method, path)
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, orjson.loads(data) if data else None


def add_ensemble(root: Path, name: str, config: str) -> None:
    (root / name / "1").mkdir(parents=True)  # an ensemble's version folder is empty
    (root / name / "config.pbtxt").write_text(config)


@pytest.fixture
def repo(tmp_path: Path, model_repository: Path) -> Path:
    for name in ("simple", "identity_int32", "identity_fp32"):
        shutil.copytree(model_repository / name, tmp_path / name)
    add_ensemble(tmp_path, "pipeline", PIPELINE)
    return tmp_path


def inputs(module: Any, rows: int = 2) -> tuple[list[Any], np.ndarray, np.ndarray]:
    a = np.arange(16 * rows, dtype=np.int32).reshape(rows, 16)
    b = np.full((rows, 16), 3, dtype=np.int32)
    tensors = []
    for name, data in (("A", a), ("B", b)):
        tensor = module.InferInput(name, [rows, 16], "INT32")
        tensor.set_data_from_numpy(data)
        tensors.append(tensor)
    return tensors, a, b


def test_pipeline_and_fan_out_over_http_and_grpc(repo: Path, launch: Any) -> None:
    server = launch([repo], NO_SERVICES)
    http_client = httpclient.InferenceServerClient(server.http_url)
    assert http_client.is_model_ready("pipeline")
    metadata = http_client.get_model_metadata("pipeline")
    assert metadata["platform"] == "ensemble"
    assert [i["shape"] for i in metadata["inputs"]] == [[-1, 16], [-1, 16]]
    config = http_client.get_model_config("pipeline")
    assert config["platform"] == "ensemble"
    assert len(config["ensemble_scheduling"]["step"]) == 3
    assert "instance_group" not in config or not config["instance_group"]

    tensors, a, b = inputs(httpclient)
    result = http_client.infer("pipeline", tensors)
    assert np.array_equal(result.as_numpy("TWICE_A"), 2 * a)
    assert np.array_equal(result.as_numpy("TWICE_B"), 2 * b)
    assert np.array_equal(result.as_numpy("SUM_COPY"), a + b)

    # Only the requested outputs come back (every step still runs).
    wanted = [httpclient.InferRequestedOutput("SUM_COPY")]
    result = http_client.infer("pipeline", tensors, outputs=wanted)
    assert result.as_numpy("TWICE_A") is None
    assert np.array_equal(result.as_numpy("SUM_COPY"), a + b)

    grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
    tensors, a, b = inputs(grpcclient, rows=3)
    result = grpc_client.infer("pipeline", tensors)
    assert np.array_equal(result.as_numpy("TWICE_A"), 2 * a)
    assert np.array_equal(result.as_numpy("SUM_COPY"), a + b)
    assert grpc_client.get_model_metadata("pipeline").platform == "ensemble"
    answers: queue.Queue[Any] = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: answers.put(error or result))
    try:
        grpc_client.async_stream_infer("pipeline", tensors, request_id="streamed")
        streamed = answers.get(timeout=30)
    finally:
        grpc_client.stop_stream()
    assert streamed.get_response().id == "streamed"
    assert np.array_equal(streamed.as_numpy("TWICE_B"), 2 * b)

    # Statistics: the ensemble's own requests (zero compute), its steps' in their models.
    stats = http_client.get_inference_statistics("pipeline")["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == 4
    assert stats["inference_count"] == 2 + 2 + 3 + 3
    assert stats["inference_stats"]["compute_infer"]["ns"] == 0
    simple = http_client.get_inference_statistics("simple")["model_stats"][0]
    assert simple["inference_stats"]["success"]["count"] == 8  # two steps per request
    identity = http_client.get_inference_statistics("identity_int32")["model_stats"][0]
    assert identity["inference_stats"]["success"]["count"] == 4

    # A request the ensemble refuses is not counted; a failing step fails the request.
    bad = httpclient.InferInput("A", [1, 15], "INT32")
    bad.set_data_from_numpy(np.zeros((1, 15), dtype=np.int32))
    with pytest.raises(InferenceServerException, match="unexpected shape for input 'A'"):
        http_client.infer("pipeline", [bad, tensors_b(httpclient)])
    assert (
        http_client.get_inference_statistics("pipeline")["model_stats"][0]["inference_stats"][
            "fail"
        ]["count"]
        == 0
    )


def tensors_b(module: Any) -> Any:
    tensor = module.InferInput("B", [1, 16], "INT32")
    tensor.set_data_from_numpy(np.zeros((1, 16), dtype=np.int32))
    return tensor


def test_load_errors_name_the_problem(repo: Path, launch: Any) -> None:
    # identity_fp32 reads an INT32 tensor: the load check catches the datatype mismatch ...
    broken = PIPELINE.replace('"identity_int32"', '"identity_fp32"').replace(
        'name: "pipeline"', 'name: "mixed"'
    )
    add_ensemble(repo, "mixed", broken)
    # ... and so does a composing model allowing fewer rows than the ensemble.
    small = (repo / "identity_int32" / "config.pbtxt").read_text()
    (repo / "identity_int32" / "config.pbtxt").write_text(
        small.replace("max_batch_size: 8", "max_batch_size: 2")
    )
    server = launch([repo], ["--exit-on-error=false", *NO_SERVICES])
    status, entries = request(server, "POST", "/v2/repository/index")
    assert status == 200
    by_name = {e["name"]: e for e in entries}
    assert by_name["mixed"]["state"] == "UNAVAILABLE"
    assert by_name["mixed"]["reason"] == (
        "in ensemble mixed, ensemble tensor sum: inconsistent data type: TYPE_INT32 is inferred "
        "from model simple while TYPE_FP32 is inferred from model identity_fp32"
    )
    assert by_name["pipeline"]["state"] == "UNAVAILABLE"
    assert "which only allows maximum batch size to be 2" in by_name["pipeline"]["reason"]


def test_explicit_mode_loads_composing_models_and_load_errors(repo: Path, launch: Any) -> None:
    add_ensemble(
        repo,
        "ghost",
        PIPELINE.replace('name: "pipeline"', 'name: "ghost"').replace(
            'model_name: "identity_int32"', 'model_name: "nonexistent"'
        ),
    )
    unwritten = PIPELINE.replace('name: "pipeline"', 'name: "unwritten"').replace(
        'value: "SUM_COPY"', 'value: "OTHER"'
    )
    add_ensemble(repo, "unwritten", unwritten)
    server = launch([repo], ["--model-control-mode=explicit", *NO_SERVICES])
    client = httpclient.InferenceServerClient(server.http_url)
    assert not client.is_model_ready("simple")

    client.load_model("pipeline")  # loads simple and identity_int32 too, as Triton does
    assert client.is_model_ready("simple")
    assert client.is_model_ready("identity_int32")
    assert not client.is_model_ready("identity_fp32")
    tensors, _, b = inputs(httpclient)
    assert np.array_equal(client.infer("pipeline", tensors).as_numpy("TWICE_B"), 2 * b)

    # Without a composing model the ensemble is not ready; a request fails with the step's error.
    client.unload_model("identity_int32")
    assert not client.is_model_ready("pipeline")
    with pytest.raises(InferenceServerException, match="'identity_int32' has no available"):
        client.infer("pipeline", tensors)
    stats = client.get_inference_statistics("pipeline")["model_stats"][0]["inference_stats"]
    assert (stats["success"]["count"], stats["fail"]["count"]) == (1, 1)
    client.load_model("pipeline")  # loads the missing model again
    assert client.is_model_ready("identity_int32")
    assert client.is_model_ready("pipeline")

    with pytest.raises(InferenceServerException) as error:
        client.load_model("ghost")
    assert (
        "ensemble 'ghost' depends on 'nonexistent' which has no loaded version. Model "
        "'nonexistent' loading failed with error: failed to load 'nonexistent', failed to poll "
        "from model repository"
    ) in str(error.value)
    with pytest.raises(InferenceServerException) as error:
        client.load_model("unwritten")
    assert (
        "failed to load 'unwritten': ensemble output 'SUM_COPY' for ensemble 'unwritten' is not "
        "used: no step's output_map writes it"
    ) in str(error.value)


def forward(name: str, model: str) -> str:
    """An ensemble sending A and B through `model` (shaped like the pipeline): TWICE_A/B."""
    return f"""
name: "{name}"
platform: "ensemble"
max_batch_size: 8
input [
  {{ name: "A" data_type: TYPE_INT32 dims: [ 16 ] }},
  {{ name: "B" data_type: TYPE_INT32 dims: [ 16 ] }}
]
output [
  {{ name: "TWICE_A" data_type: TYPE_INT32 dims: [ 16 ] }},
  {{ name: "TWICE_B" data_type: TYPE_INT32 dims: [ 16 ] }}
]
ensemble_scheduling {{
  step [
    {{
      model_name: "{model}"
      input_map {{ key: "A" value: "A" }}
      input_map {{ key: "B" value: "B" }}
      output_map {{ key: "TWICE_A" value: "TWICE_A" }}
      output_map {{ key: "TWICE_B" value: "TWICE_B" }}
    }}
  ]
}}
"""


def test_nested_ensembles_and_cycles(repo: Path, launch: Any) -> None:
    add_ensemble(repo, "outer", forward("outer", "pipeline"))
    add_ensemble(repo, "loop_a", forward("loop_a", "loop_b"))
    add_ensemble(repo, "loop_b", forward("loop_b", "loop_a"))
    server = launch([repo], ["--exit-on-error=false", *NO_SERVICES])
    client = httpclient.InferenceServerClient(server.http_url)
    tensors, a, b = inputs(httpclient)
    result = client.infer("outer", tensors)  # an ensemble whose step is an ensemble
    assert np.array_equal(result.as_numpy("TWICE_A"), 2 * a)
    assert np.array_equal(result.as_numpy("TWICE_B"), 2 * b)
    _, entries = request(server, "POST", "/v2/repository/index")
    reasons = {e["name"]: e.get("reason", "") for e in entries}
    assert reasons["loop_a"] == "circular dependency between ensembles: loop_a -> loop_b -> loop_a"
    assert reasons["loop_b"] == "circular dependency between ensembles: loop_b -> loop_a -> loop_b"
