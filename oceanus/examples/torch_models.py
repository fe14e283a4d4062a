"""TorchScript examples for the PyTorch backend: ``simple_pytorch``, ``resnet_small_pytorch`` and
``resnet50_pytorch`` (resnet50_onnx's network and weights; not in the default repository).

Needs PyTorch (``pip install oceanus[pytorch]``); the generator lists these models only where it
imports. Weights come from numpy's seeded generator, so a PyTorch release writes the same file
every time.

``resnet_small_pytorch`` is a ResNet-18-shaped network (a 3x3 stem, four stages of two basic
blocks, global average pooling, a 1000-way classifier) narrowed to widths 16/32/64/128: ~0.83 M
parameters, a ~3 MB file, ~0.22 GFLOP per 224x224 image (ResNet-50: ~8 GFLOP). It runs as two
instances (on the CPU when there is no GPU: one intra-op thread each on a 2-core machine), like
``resnet50_onnx``: one instance with two OpenMP threads lost 1.2-1.6x of its throughput to the
event loop and the load generator on the 2-core dev machine, since every operator's OpenMP
barrier waits for whichever of its threads was preempted (bench/README.md, issue 8).
"""

from __future__ import annotations

import math
import pathlib
import warnings
from typing import Any

import numpy as np

from . import resnet

SIMPLE_NAME = "simple_pytorch"
RESNET_NAME = "resnet_small_pytorch"
RESNET50_NAME = "resnet50_pytorch"
SEED = 18

SIMPLE_CONFIG = """\
name: "simple_pytorch"
platform: "pytorch_libtorch"
max_batch_size: 8
input [
  {
    name: "INPUT__0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "INPUT__1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
output [
  {
    name: "OUTPUT__0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "OUTPUT__1"
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
name: "resnet_small_pytorch"
platform: "pytorch_libtorch"
max_batch_size: 32
input [
  {
    name: "INPUT__0"
    data_type: TYPE_FP32
    dims: [ 3, 224, 224 ]
  }
]
output [
  {
    name: "OUTPUT__0"
    data_type: TYPE_FP32
    dims: [ 1000 ]
  }
]
dynamic_batching {
  preferred_batch_size: [ 8, 16, 32 ]
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

# resnet50_onnx's network and weights in TorchScript (build_resnet50): not in the default repository
# (a 100 MB file and two more ResNet-50 instances to load at every start); the benchmark and
# `python -m oceanus.examples DIR --models resnet50_pytorch` name it.
# Batches of at most 8: with one intra-op thread per instance, TorchScript's ResNet-50 costs more
# per image the larger the batch (single thread, in-process: 7.4 images/s at batch 1, 6.8 at 8,
# 5.0 at 32), so bigger batches would only slow it down.
RESNET50_CONFIG = (
    RESNET_CONFIG.replace(RESNET_NAME, RESNET50_NAME)
    .replace("max_batch_size: 32", "max_batch_size: 8")
    .replace("preferred_batch_size: [ 8, 16, 32 ]", "preferred_batch_size: [ 8 ]")
)

# (width, stride of the stage's first block); two basic blocks per stage as in ResNet-18.
_STAGES = ((16, 1), (32, 2), (64, 2), (128, 2))
_RESIDUAL_GAIN = 0.3  # keeps random-weight activations bounded (see resnet.py)


def build_simple() -> Any:
    """OUTPUT__0 = INPUT__0 + INPUT__1, OUTPUT__1 = INPUT__0 - INPUT__1 (scripted)."""
    import torch

    class Simple(torch.nn.Module):
        def forward(
            self,
            INPUT__0: torch.Tensor,
            INPUT__1: torch.Tensor,  # Triton's names
        ) -> tuple[torch.Tensor, torch.Tensor]:
            return INPUT__0 + INPUT__1, INPUT__0 - INPUT__1

    return torch.jit.script(Simple())


def build_resnet() -> Any:
    import torch
    from torch import nn

    rng = np.random.default_rng(SEED)

    def conv(cin: int, cout: int, k: int, stride: int, gain: float = 1.0) -> nn.Conv2d:
        layer = nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=True)
        std = math.sqrt(2.0 / (cin * k * k)) * gain
        with torch.no_grad():
            layer.weight.copy_(
                torch.from_numpy(rng.normal(0.0, std, (cout, cin, k, k)).astype(np.float32))
            )
            assert layer.bias is not None
            layer.bias.zero_()
        return layer

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = conv(cin, cout, 3, stride)
            self.conv2 = conv(cout, cout, 3, 1, gain=_RESIDUAL_GAIN)
            self.shortcut = (
                conv(cin, cout, 1, stride) if stride != 1 or cin != cout else nn.Identity()
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(self.conv1(x))
            return torch.relu(self.conv2(y) + self.shortcut(x))

    class ResNetSmall(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = conv(3, 16, 3, 2)
            self.pool = nn.MaxPool2d(3, stride=2, padding=1)
            blocks = []
            cin = 16
            for width, stride in _STAGES:
                blocks += [Block(cin, width, stride), Block(width, width, 1)]
                cin = width
            self.blocks = nn.Sequential(*blocks)
            self.fc = nn.Linear(cin, 1000)
            with torch.no_grad():
                self.fc.weight.copy_(
                    torch.from_numpy(
                        rng.normal(0.0, 1.0 / math.sqrt(cin), (1000, cin)).astype(np.float32)
                    )
                )
                self.fc.bias.zero_()

        def forward(self, INPUT__0: torch.Tensor) -> torch.Tensor:
            x = self.pool(torch.relu(self.stem(INPUT__0)))
            x = self.blocks(x)
            logits: torch.Tensor = self.fc(torch.flatten(torch.mean(x, dim=(2, 3)), 1))
            return logits

    return torch.jit.script(ResNetSmall().eval())


def build_resnet50() -> Any:
    """``resnet50_onnx``'s network and weights as TorchScript: each ONNX Conv (BN folded, with a
    bias), MaxPool and the final Gemm become the torch layer with the same tensors, built in the
    order ``resnet.build`` emits them, so both files compute the same function."""
    import torch
    from onnx import numpy_helper
    from torch import nn

    graph = resnet.build().graph
    weights = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    convs = iter(node for node in graph.node if node.op_type == "Conv")
    gemm = next(node for node in graph.node if node.op_type == "Gemm")

    def conv() -> nn.Conv2d:
        node = next(convs)
        attributes = {a.name: list(a.ints) for a in node.attribute}
        weight = torch.from_numpy(weights[node.input[1]].copy())
        cout, cin, k, _ = weight.shape
        stride = attributes["strides"][0]
        layer = nn.Conv2d(cin, cout, k, stride=stride, padding=attributes["pads"][0])
        with torch.no_grad():
            layer.weight.copy_(weight)
            assert layer.bias is not None
            layer.bias.copy_(torch.from_numpy(weights[node.input[2]].copy()))
        return layer

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, width: int, stride: int) -> None:
            super().__init__()
            cout = width * resnet.EXPANSION
            self.conv1, self.conv2, self.conv3 = conv(), conv(), conv()
            self.shortcut = conv() if stride != 1 or cin != cout else nn.Identity()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(self.conv2(torch.relu(self.conv1(x))))
            return torch.relu(self.conv3(y) + self.shortcut(x))

    class ResNet50(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = conv()
            self.pool = nn.MaxPool2d(3, stride=2, padding=1)
            blocks = []
            cin = 64
            for width, count, stride in resnet.STAGES:
                for i in range(count):
                    blocks.append(Bottleneck(cin, width, stride if i == 0 else 1))
                    cin = width * resnet.EXPANSION
            self.blocks = nn.Sequential(*blocks)
            self.fc = nn.Linear(cin, 1000)
            with torch.no_grad():
                self.fc.weight.copy_(torch.from_numpy(weights[gemm.input[1]].copy()))
                self.fc.bias.copy_(torch.from_numpy(weights[gemm.input[2]].copy()))

        def forward(self, INPUT__0: torch.Tensor) -> torch.Tensor:
            x = self.pool(torch.relu(self.stem(INPUT__0)))
            x = self.blocks(x)
            logits: torch.Tensor = self.fc(torch.flatten(torch.mean(x, dim=(2, 3)), 1))
            return logits

    model = ResNet50().eval()
    assert next(convs, None) is None, "every ONNX Conv has its torch layer"
    return torch.jit.script(model)


def _save(build: Any, path: pathlib.Path) -> None:
    # TorchScript is deprecated in favour of torch.export (torch 2.13 warns on every script and
    # save); Triton's PyTorch backend still serves it, and so do we.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        build().save(str(path))


def write_simple(version_dir: pathlib.Path) -> None:
    _save(build_simple, version_dir / "model.pt")


def write_resnet(version_dir: pathlib.Path) -> None:
    _save(build_resnet, version_dir / "model.pt")


def write_resnet50(version_dir: pathlib.Path) -> None:
    _save(build_resnet50, version_dir / "model.pt")
