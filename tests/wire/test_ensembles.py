"""Ensemble models (platform "ensemble") on a real server: a pipeline with fan-out over HTTP,
gRPC and a gRPC stream, its metadata, config and statistics. Routing, load errors, explicit
loading of composing models and nesting are tested in process:
tests/core/test_ensembles_rules.py."""

from __future__ import annotations

import queue
import shutil
from pathlib import Path
from typing import Any

import numpy as np
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
