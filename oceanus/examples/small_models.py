"""The small example models: ``simple``, ``simple_dyna``, ``slow_fp32`` and ``identity_*``."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from ._graph import GraphBuilder

# Triton datatype suffix -> (config TYPE_ name, ONNX element type). Every one of these was
# checked to load and run through onnxruntime's CPU provider (tests/examples). Two need care
# in a backend: BF16 has no numpy dtype (feed/fetch it as uint16 bits through
# OrtValue.ortvalue_from_numpy_with_onnx_type), and BYTES is an ONNX string tensor, which ORT
# treats as UTF-8 text (a numpy object array of bytes objects gets str()-ed, e.g. "b'ab'").
IDENTITY_TYPES: dict[str, tuple[str, int]] = {
    "bool": ("TYPE_BOOL", TensorProto.BOOL),
    "int8": ("TYPE_INT8", TensorProto.INT8),
    "int16": ("TYPE_INT16", TensorProto.INT16),
    "int32": ("TYPE_INT32", TensorProto.INT32),
    "int64": ("TYPE_INT64", TensorProto.INT64),
    "uint8": ("TYPE_UINT8", TensorProto.UINT8),
    "uint16": ("TYPE_UINT16", TensorProto.UINT16),
    "uint32": ("TYPE_UINT32", TensorProto.UINT32),
    "uint64": ("TYPE_UINT64", TensorProto.UINT64),
    "fp16": ("TYPE_FP16", TensorProto.FLOAT16),
    "fp32": ("TYPE_FP32", TensorProto.FLOAT),
    "fp64": ("TYPE_FP64", TensorProto.DOUBLE),
    "bf16": ("TYPE_BF16", TensorProto.BFLOAT16),
    # Triton's wire datatype BYTES is TYPE_STRING in model configs.
    "bytes": ("TYPE_STRING", TensorProto.STRING),
}

_CPU_INSTANCE = """\
instance_group [
  {{
    count: {count}
    kind: KIND_CPU
  }}
]
"""


def _tensors(kind: str, dtype: str, dims: str, names: list[str]) -> str:
    """A config ``input [...]``/``output [...]`` block of tensors sharing dtype and dims."""
    entries = ",\n".join(
        f'  {{\n    name: "{name}"\n    data_type: {dtype}\n    dims: [ {dims} ]\n  }}'
        for name in names
    )
    return f"{kind} [\n{entries}\n]\n"


def _config(
    name: str,
    max_batch_size: int,
    dtype: str,
    dims: str,
    inputs: list[str],
    outputs: list[str],
    instances: int,
    dynamic_batching: bool = False,
) -> str:
    text = f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {max_batch_size}\n'
    text += _tensors("input", dtype, dims, inputs) + _tensors("output", dtype, dims, outputs)
    if dynamic_batching:
        text += "dynamic_batching { }\n"
    return text + _CPU_INSTANCE.format(count=instances)


# Same as Triton's client-example "simple" model; "simple_dyna" adds dynamic batching and a
# second instance so batching tests have something to batch.
SIMPLE_CONFIG = _config(
    "simple", 8, "TYPE_INT32", "16", ["INPUT0", "INPUT1"], ["OUTPUT0", "OUTPUT1"], instances=1
)
SIMPLE_DYNA_CONFIG = _config(
    "simple_dyna",
    8,
    "TYPE_INT32",
    "16",
    ["INPUT0", "INPUT1"],
    ["OUTPUT0", "OUTPUT1"],
    instances=2,
    dynamic_batching=True,
)


def build_simple() -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (INT32 [batch, 16])."""
    b = GraphBuilder("simple", seed=0)
    b.op("Add", ["INPUT0", "INPUT1"], output="OUTPUT0")
    b.op("Sub", ["INPUT0", "INPUT1"], output="OUTPUT1")

    def info(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.INT32, ["batch", 16])

    return b.model([info("INPUT0"), info("INPUT1")], [info("OUTPUT0"), info("OUTPUT1")])


def identity_name(suffix: str) -> str:
    return f"identity_{suffix}"


def identity_config(suffix: str) -> str:
    dtype = IDENTITY_TYPES[suffix][0]
    return _config(identity_name(suffix), 8, dtype, "-1", ["INPUT0"], ["OUTPUT0"], instances=1)


def build_identity(suffix: str) -> onnx.ModelProto:
    elem_type = IDENTITY_TYPES[suffix][1]
    b = GraphBuilder(identity_name(suffix), seed=0)
    b.op("Identity", ["INPUT0"], output="OUTPUT0")
    return b.model(
        [helper.make_tensor_value_info("INPUT0", elem_type, ["batch", "length"])],
        [helper.make_tensor_value_info("OUTPUT0", elem_type, ["batch", "length"])],
    )


# slow_fp32: a fixed amount of CPU work per execution, independent of batch size, so
# scheduling/queueing tests get a model whose executions take tens of milliseconds.
# SLOW_STEPS x ([256, 1024] @ [1024, 1024]) ~ SLOW_STEPS x 0.54 GFLOP: tens of ms per run,
# whatever the batch size (bench/README.md, "Figures behind code comments").
SLOW_STEPS = 6
_SLOW_ROWS = 256
_SLOW_WIDTH = 1024

SLOW_CONFIG = _config("slow_fp32", 64, "TYPE_FP32", "16", ["INPUT0"], ["OUTPUT0"], instances=1)


def build_slow(steps: int = SLOW_STEPS) -> onnx.ModelProto:
    """OUTPUT0 is INPUT0 bit for bit, but only after `steps` big MatMuls have run."""
    b = GraphBuilder("slow_fp32", seed=16)
    # The heavy chain starts from a scalar computed from the input, so onnxruntime cannot
    # constant-fold it away, and its cost does not depend on the batch size.
    seed = b.op("Tanh", [b.op("ReduceMean", ["INPUT0"], keepdims=1)])  # [1, 1]
    h = b.op("Add", [seed, b.normal((_SLOW_ROWS, _SLOW_WIDTH), 1.0, "slow_h0")])
    # One shared weight keeps the file at 4 MB; 1/sqrt(width) keeps the MatMul outputs O(1).
    w = b.normal((_SLOW_WIDTH, _SLOW_WIDTH), 1.0 / np.sqrt(_SLOW_WIDTH), "slow_w")
    for _ in range(steps):
        h = b.op("Tanh", [b.op("MatMul", [h, w])])
    # |tanh| <= 1, so the condition is always false (also for NaN) and Where returns INPUT0
    # exactly; "INPUT0 + 0 * heavy" would turn -0.0 into +0.0 and could propagate NaN.
    never = b.op("Greater", [b.op("ReduceMax", [h], keepdims=1), b.const(2.0)])
    b.op("Where", [never, seed, "INPUT0"], output="OUTPUT0")
    return b.model(
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 16])],
    )


# accumulator_onnx: a running sum per sequence kept by the server (implicit state): OUTPUT =
# INPUT_STATE + INPUT, and OUTPUT_STATE, the same sum, is what the next request of the sequence
# gets as INPUT_STATE (zeros on its START request). docs/sequence-batching.md, "Implicit state".
ACCUMULATOR_NAME = "accumulator_onnx"
ACCUMULATOR_CONFIG = f"""\
name: "{ACCUMULATOR_NAME}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
sequence_batching {{
  max_sequence_idle_microseconds: 5000000
  oldest {{ max_candidate_sequences: 8 preferred_batch_size: [ 8 ] }}
  state [
    {{
      input_name: "INPUT_STATE"
      output_name: "OUTPUT_STATE"
      data_type: TYPE_INT32
      dims: [ 1 ]
      initial_state {{ name: "zeros" data_type: TYPE_INT32 dims: [ 1 ] zero_data: true }}
    }}
  ]
}}
""" + _CPU_INSTANCE.format(count=1)


def build_accumulator() -> onnx.ModelProto:
    """OUTPUT = OUTPUT_STATE = INPUT + INPUT_STATE (INT32 [batch, 1])."""
    b = GraphBuilder(ACCUMULATOR_NAME, seed=0)
    total = b.op("Add", ["INPUT", "INPUT_STATE"], output="OUTPUT")
    b.op("Identity", [total], output="OUTPUT_STATE")

    def info(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.INT32, ["batch", 1])

    return b.model([info("INPUT"), info("INPUT_STATE")], [info("OUTPUT"), info("OUTPUT_STATE")])
