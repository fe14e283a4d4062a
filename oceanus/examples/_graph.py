"""Tiny helpers for building ONNX graphs by hand with ``onnx.helper``."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

# Opset 17 is the newest opset whose ops we need (LayerNormalization arrived in 17) and IR 8 is
# the IR version that introduced it, so the files load in every onnxruntime from 1.13 onwards.
OPSET = 17
IR_VERSION = 8
PRODUCER = "oceanus.examples"


def make_model(graph: onnx.GraphProto) -> onnx.ModelProto:
    """Wrap *graph* in a model pinned to OPSET/IR_VERSION (not the onnx package's newest)."""
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name=PRODUCER
    )
    model.ir_version = IR_VERSION
    return model


class GraphBuilder:
    """Accumulates nodes and initializers, handing out unique tensor names."""

    def __init__(self, name: str, seed: int) -> None:
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._ids = itertools.count()

    def _fresh(self, hint: str) -> str:
        return f"{hint}_{next(self._ids)}"

    def const(self, value: np.ndarray | float | int | Sequence[int], hint: str = "c") -> str:
        """Add an initializer; Python lists become int64 (shapes/axes), scalars float32."""
        if isinstance(value, np.ndarray):
            array = value
        elif isinstance(value, (list, tuple)):
            array = np.asarray(value, dtype=np.int64)
        else:
            array = np.asarray(value, dtype=np.float32)
        name = self._fresh(hint)
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def normal(self, shape: Sequence[int], std: float, hint: str = "w") -> str:
        """Random float32 initializer drawn from N(0, std^2) with the builder's seeded RNG."""
        array = self.rng.standard_normal(tuple(shape), dtype=np.float32)
        array *= np.float32(std)
        return self.const(array, hint)

    def op(
        self, op_type: str, inputs: Sequence[str], output: str | None = None, **attrs: Any
    ) -> str:
        """Append a single-output node and return the name of its output."""
        out = output if output is not None else self._fresh(op_type.lower())
        self.nodes.append(
            helper.make_node(op_type, list(inputs), [out], name=self._fresh(op_type), **attrs)
        )
        return out

    def model(
        self, inputs: Sequence[onnx.ValueInfoProto], outputs: Sequence[onnx.ValueInfoProto]
    ) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, self.name, list(inputs), list(outputs), initializer=self.initializers
        )
        return make_model(graph)
