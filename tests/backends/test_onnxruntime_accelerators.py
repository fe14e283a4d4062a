"""ONNX Runtime execution accelerators from the config (`optimization { execution_accelerators
{ gpu_execution_accelerator [ { name: "tensorrt" } ] cpu_execution_accelerator [ { name:
"openvino" } ] } }`): used where this ONNX Runtime build has the provider, skipped with a warning
where it has not, an unknown name fails the load as in Triton."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

sys.path.insert(0, str(Path(__file__).parent))
from backend_testlib import NO_METRICS, http_infer, index, write_model

from oceanus.backends.onnxruntime import OnnxRuntimeBackend
from oceanus.core.backend import InstanceSpec
from oceanus.examples.repository import example_repository

SIMPLE_IO = """
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
"""
TENSORRT = """
optimization { execution_accelerators { gpu_execution_accelerator [ {
  name: "tensorrt"
  parameters { key: "precision_mode" value: "FP16" }
  parameters { key: "max_workspace_size_bytes" value: "1073741824" }
  parameters { key: "trt_engine_cache_enable" value: "1" }
} ] } }
"""
OPENVINO = """
optimization { execution_accelerators { cpu_execution_accelerator [ { name: "openvino" } ] } }
"""
CPU = "instance_group [ { kind: KIND_CPU } ]"
GPU = "instance_group [ { kind: KIND_GPU } ]"
MODELS = {
    "ort_openvino": OPENVINO + CPU,
    "ort_tensorrt_cpu": TENSORRT + CPU,
    "ort_tensorrt_gpu": TENSORRT + GPU,
    "ort_both": TENSORRT.replace(
        "} ] } }", '} ]\n cpu_execution_accelerator [ { name: "openvino" } ] } }'
    )
    + GPU,
    "ort_unknown_cpu": OPENVINO.replace('"openvino"', '"fpga"') + CPU,
    "ort_unknown_gpu": TENSORRT.replace('"tensorrt"', '"warp_drive"') + GPU,
}


def _config(name: str, body: str) -> str:
    return f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n{SIMPLE_IO}\n{body}'


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, launch_module: Any) -> Any:
    repo = tmp_path_factory.mktemp("ort")
    onnx_file = example_repository(["simple"]) / "simple" / "1" / "model.onnx"
    for name, body in MODELS.items():
        write_model(repo, name, _config(name, body), {"model.onnx": onnx_file})
    return launch_module([repo], ["--exit-on-error=false", "--allow-grpc=false", *NO_METRICS])


@pytest.mark.parametrize(
    "model", ["ort_openvino", "ort_tensorrt_cpu", "ort_tensorrt_gpu", "ort_both"]
)
def test_accelerated_models_load_and_infer(server: Any, model: str) -> None:
    rng = np.random.default_rng(0)
    a = rng.integers(-1000, 1000, (3, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, (3, 16), dtype=np.int32)
    result = http_infer(server.http_url, model, {"INPUT0": a, "INPUT1": b})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_missing_provider_is_a_warning(server: Any) -> None:
    if "OpenVINOExecutionProvider" in ort.get_available_providers():
        pytest.skip("this ONNX Runtime build has the OpenVINO execution provider")
    assert (
        "model 'ort_openvino': execution accelerator 'openvino' requested but this ONNX Runtime "
        "build has no OpenVINOExecutionProvider" in server.log()
    )


@pytest.mark.parametrize(
    ("model", "name"), [("ort_unknown_cpu", "fpga"), ("ort_unknown_gpu", "warp_drive")]
)
def test_unknown_accelerator_fails_the_load(server: Any, model: str, name: str) -> None:
    entry = index(server.http_url)[model]
    assert entry["state"] == "UNAVAILABLE"
    assert f"unknown Execution Accelerator '{name}' is requested" in entry["reason"]


def test_provider_options_follow_tritons_mapping(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU instance of a build that has every provider, the accelerators become ORT's
    providers in Triton's order, with Triton's parameters mapped to ORT's option names."""
    monkeypatch.setattr(
        ort,
        "get_available_providers",
        lambda: [
            "TensorrtExecutionProvider",
            "CUDAExecutionProvider",
            "OpenVINOExecutionProvider",
            "CPUExecutionProvider",
        ],
    )
    config = text_format.Parse(_config("m", MODELS["ort_both"]), mc.ModelConfig())
    spec = InstanceSpec(name="m_0_0", kind="GPU", device_id=1, cpu_threads=2)
    providers = OnnxRuntimeBackend()._execution_providers(config, spec)
    assert providers == [
        (
            "TensorrtExecutionProvider",
            {
                "device_id": "1",
                "trt_fp16_enable": "True",
                "trt_max_workspace_size": "1073741824",
                "trt_engine_cache_enable": "1",
            },
        ),
        ("CUDAExecutionProvider", {"device_id": "1"}),
        ("OpenVINOExecutionProvider", {"device_type": "CPU"}),
        "CPUExecutionProvider",
    ]
    # A CPU instance never gets the GPU providers.
    cpu = InstanceSpec(name="m_0_0", kind="CPU", device_id=0, cpu_threads=2)
    config = text_format.Parse(_config("m", MODELS["ort_tensorrt_cpu"]), mc.ModelConfig())
    assert OnnxRuntimeBackend()._execution_providers(config, cpu) == ["CPUExecutionProvider"]
