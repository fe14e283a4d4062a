"""``resnet50_onnx``: the ResNet-50 (v1.5) topology with random, seeded weights.

Batch normalisation is folded into each convolution's weights and bias (as inference exporters
do), so every conv carries a bias and no BatchNormalization nodes appear. The weights are
random: the model exercises the same compute as a real ResNet-50 but its labels are meaningless.

~25.5M parameters, a ~100 MB file; its speed in process is in bench/README.md ("Figures
behind code comments") and `python bench/inproc.py --models resnet50_onnx` measures it.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper

from ._graph import GraphBuilder

NAME = "resnet50_onnx"
SEED = 50

CONFIG = """\
name: "resnet50_onnx"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [
  {
    name: "input"
    data_type: TYPE_FP32
    dims: [ 3, 224, 224 ]
  }
]
output [
  {
    name: "output"
    data_type: TYPE_FP32
    dims: [ 1000 ]
  }
]
dynamic_batching {
  preferred_batch_size: [ 8, 16, 32, 64 ]
  max_queue_delay_microseconds: 5000
}
instance_group [
  {
    # No kind: a GPU when there is one, else the CPU (Triton's KIND_AUTO), so the
    # model loads on either machine, Oceanus or Triton, with nothing to warn about.
    count: 2
  }
]
"""

# (bottleneck width, number of blocks, stride of the stage's first block); output = width * 4.
STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))
EXPANSION = 4
# A trained net keeps activations bounded through its BN gammas; with random weights the
# residual sums would double the variance every block (2^16 over 16 blocks), so the branch
# that joins a residual sum is scaled down, like the small last-BN gamma of common inits.
_RESIDUAL_GAIN = 0.3


def _conv(
    b: GraphBuilder, x: str, cin: int, cout: int, k: int, stride: int, gain: float = 1.0
) -> str:
    """Conv with a folded-BN bias; He init (std sqrt(2/fan_in)) keeps ReLU nets' scale."""
    std = math.sqrt(2.0 / (cin * k * k)) * gain
    w = b.normal((cout, cin, k, k), std, "conv_w")
    bias = b.const(np.zeros(cout, dtype=np.float32), "conv_b")
    pad = k // 2
    return b.op(
        "Conv",
        [x, w, bias],
        kernel_shape=[k, k],
        strides=[stride, stride],
        pads=[pad, pad, pad, pad],
    )


def _bottleneck(b: GraphBuilder, x: str, cin: int, width: int, stride: int) -> str:
    cout = width * EXPANSION
    y = b.op("Relu", [_conv(b, x, cin, width, 1, 1)])
    # v1.5 (torchvision) puts the stride on the 3x3 conv rather than the first 1x1.
    y = b.op("Relu", [_conv(b, y, width, width, 3, stride)])
    y = _conv(b, y, width, cout, 1, 1, gain=_RESIDUAL_GAIN)
    shortcut = x
    if stride != 1 or cin != cout:
        shortcut = _conv(b, x, cin, cout, 1, stride)
    return b.op("Relu", [b.op("Add", [y, shortcut])])


def build() -> onnx.ModelProto:
    b = GraphBuilder(NAME, SEED)
    x = b.op("Relu", [_conv(b, "input", 3, 64, 7, 2)])
    x = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for width, blocks, stride in STAGES:
        for i in range(blocks):
            x = _bottleneck(b, x, cin, width, stride if i == 0 else 1)
            cin = width * EXPANSION
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])], axis=1)
    fc_w = b.normal((1000, cin), 1.0 / math.sqrt(cin), "fc_w")
    fc_b = b.const(np.zeros(1000, dtype=np.float32), "fc_b")
    b.op("Gemm", [x, fc_w, fc_b], output="output", transB=1)
    return b.model(
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 224, 224])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 1000])],
    )
