"""A repository for the in-process API's tests: example models, the Python backend's decoupled
`repeat`, and `identity` shaped like the model of NVIDIA's in-process API hello world
(string_input -> string_output, dims [-1, -1], no batching)."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from oceanus.examples import example_repository

PYTHON_MODELS = Path(__file__).parent.parent / "backends" / "python" / "models"


def _config(name: str, kind: str, data_type: str) -> str:
    return f"""\
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ {{ name: "{kind}_input" data_type: {data_type} dims: [ -1, -1 ] }} ]
output [ {{ name: "{kind}_output" data_type: {data_type} dims: [ -1, -1 ] }} ]
"""


def _identity_model(kind: str, element_type: int) -> onnx.ModelProto:
    def info(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, element_type, ["rows", "columns"])

    graph = helper.make_graph(
        [helper.make_node("Identity", [f"{kind}_input"], [f"{kind}_output"])],
        "identity",
        [info(f"{kind}_input")],
        [info(f"{kind}_output")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def write_identity(root: Path, name: str, kind: str, data_type: str, element_type: int) -> None:
    folder = root / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(_config(name, kind, data_type))
    onnx.save(_identity_model(kind, element_type), folder / "1" / "model.onnx")


@pytest.fixture(scope="module", autouse=True)
def oceanus_logging_restored() -> Iterator[None]:
    """An embedded server applies its log settings to the `oceanus` logger (its own handler, no
    propagation), as the command line does: put the logger back for the tests after these, whose
    caplog reads what propagates to the root."""
    logger = logging.getLogger("oceanus")
    saved = (logger.level, list(logger.handlers), logger.propagate)
    yield
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    logger.setLevel(saved[0])
    for handler in saved[1]:
        logger.addHandler(handler)
    logger.propagate = saved[2]


@pytest.fixture(scope="package")
def embedded_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("embedded-models")
    examples = example_repository(["simple", "simple_dyna", "identity_fp32"])
    for name in ("simple", "simple_dyna", "identity_fp32"):
        shutil.copytree(examples / name, root / name)
    shutil.copytree(PYTHON_MODELS / "repeat", root / "repeat")
    # NVIDIA's hello world model (string_input -> string_output) and an FP16 one as in the
    # InferenceRequest docstring of its package.
    write_identity(root, "identity", "string", "TYPE_STRING", TensorProto.STRING)
    write_identity(root, "identity_fp16", "fp16", "TYPE_FP16", TensorProto.FLOAT16)
    return root
