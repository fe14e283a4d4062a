"""OpenVINO IR examples, converted from the ONNX examples: ``simple_openvino`` and
``resnet50_openvino``.

Needs OpenVINO (``pip install oceanus[openvino]``); the generator lists these models only where it
imports. Each is the ONNX example (same weights, same names) read by OpenVINO and saved as
``model.xml`` + ``model.bin`` with FP32 weights (so its outputs match the ONNX model's) and an
"N..." layout on every input and output (the first dimension is the batch). Converting
ResNet-50 takes about 1 s on the 2-core dev machine; its IR is ~100 MB like the ONNX file.
"""

from __future__ import annotations

import pathlib

from . import resnet, small_models

SIMPLE_NAME = "simple_openvino"
RESNET_NAME = "resnet50_openvino"

SIMPLE_CONFIG = """\
name: "simple_openvino"
backend: "openvino"
max_batch_size: 8
input [
  {
    name: "INPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "OUTPUT1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
dynamic_batching { }
instance_group [
  {
    count: 2
    kind: KIND_CPU
  }
]
"""

RESNET_CONFIG = """\
name: "resnet50_openvino"
backend: "openvino"
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
    count: 1
    kind: KIND_CPU
  }
]
"""


def _write_ir(onnx_bytes: bytes, version_dir: pathlib.Path) -> None:
    import openvino as ov

    model = ov.Core().read_model(onnx_bytes)
    # The first dimension is the batch: saying so lets auto-complete (ours and Triton's) see
    # that the model batches.
    for port in (*model.inputs, *model.outputs):
        port.get_node().set_layout(ov.Layout("N..."))
    ov.save_model(model, str(version_dir / "model.xml"), compress_to_fp16=False)


def write_simple(version_dir: pathlib.Path) -> None:
    _write_ir(small_models.build_simple().SerializeToString(), version_dir)


def write_resnet(version_dir: pathlib.Path) -> None:
    _write_ir(resnet.build().SerializeToString(), version_dir)
