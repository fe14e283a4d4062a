"""The TensorRT backend: without an NVIDIA GPU a plan fails to load and says why; with one (and
the tensorrt package), an engine built here from the ONNX example serves over HTTP."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

sys.path.insert(0, str(Path(__file__).parent))
from backend_testlib import NO_METRICS, http_infer, index, write_model

from oceanus.backends.tensorrt import gpu_count
from oceanus.examples import small_models
from oceanus.examples.repository import example_repository

SIMPLE_IO = """
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
"""
GPUS = gpu_count()


def _plan_config(name: str, max_batch: int = 8) -> str:
    return (
        f'name: "{name}"\nplatform: "tensorrt_plan"\nmax_batch_size: {max_batch}\n'
        f"{SIMPLE_IO}\ninstance_group [ {{ kind: KIND_GPU }} ]\n"
    )


@pytest.mark.skipif(GPUS > 0, reason="this machine has an NVIDIA GPU: the GPU test covers it")
def test_without_a_gpu_a_plan_fails_to_load_saying_so(tmp_path: Path, launch: Any) -> None:
    repo = tmp_path / "repo"
    onnx_simple = example_repository(["simple"]) / "simple"
    write_model(
        repo,
        "simple",
        (onnx_simple / "config.pbtxt").read_text(),
        {"model.onnx": onnx_simple / "1" / "model.onnx"},
    )
    write_model(repo, "plan_model", _plan_config("plan_model"), {"model.plan": b"not-an-engine"})
    write_model(repo, "plan_auto", "", {"model.plan": b"not-an-engine"})  # found by file name
    server = launch([repo], ["--exit-on-error=false", "--allow-grpc=false", *NO_METRICS])
    entries = index(server.http_url)
    for name in ("plan_model", "plan_auto"):
        assert entries[name]["state"] == "UNAVAILABLE"
        assert (
            f"unable to load model '{name}': the TensorRT backend requires an NVIDIA GPU"
            in entries[name]["reason"]
        )
    assert entries["simple"]["state"] == "READY"
    assert "requires an NVIDIA GPU" in server.log()


def _build_engine(path: Path) -> None:
    """The ONNX `simple` model built into a TensorRT engine with batch 1..8."""
    trt = pytest.importorskip("tensorrt")
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    if hasattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH"):
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    assert parser.parse(small_models.build_simple().SerializeToString()), parser.get_error(0)
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for name in ("INPUT0", "INPUT1"):
        profile.set_shape(name, (1, 16), (4, 16), (8, 16))
    config.add_optimization_profile(profile)
    engine = builder.build_serialized_network(network, config)
    assert engine is not None
    path.write_bytes(bytes(engine))


@pytest.mark.skipif(GPUS == 0, reason="needs an NVIDIA GPU (no CUDA device found)")
def test_engine_serves_on_the_gpu(tmp_path: Path, launch: Any) -> None:
    pytest.importorskip("tensorrt", reason="needs TensorRT: pip install oceanus[tensorrt]")
    engine = tmp_path / "model.plan"
    _build_engine(engine)
    repo = tmp_path / "repo"
    write_model(repo, "simple_plan", _plan_config("simple_plan"), {"model.plan": engine})
    write_model(repo, "simple_plan_auto", "", {"model.plan": engine})
    server = launch([repo], ["--exit-on-error=false", "--allow-grpc=false", *NO_METRICS])
    rng = np.random.default_rng(0)
    for rows in (1, 5, 8):
        a = rng.integers(-1000, 1000, (rows, 16), dtype=np.int32)
        b = rng.integers(-1000, 1000, (rows, 16), dtype=np.int32)
        for model in ("simple_plan", "simple_plan_auto"):
            result = http_infer(server.http_url, model, {"INPUT0": a, "INPUT1": b})
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    config = httpclient.InferenceServerClient(server.http_url).get_model_config("simple_plan_auto")
    assert config["max_batch_size"] == 8
    assert [t["dims"] for t in config["input"]] == [[16], [16]]
