"""Implicit state (`sequence_batching { state [...] }`, core/scheduling/implicit_state.py) in the
core: the example accumulator (ONNX Runtime) keeps a running sum per sequence across concurrent
sequences, a growing state changes shape, initial state comes from zeros or a data file, the
state is freed with its sequence (10,000 sequences leave nothing behind), and wrong configs
fail their load with Triton's texts."""

from __future__ import annotations

import asyncio
import gc
import shutil
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from oceanus.backends import builtin
from oceanus.core.server import CoreOptions, ServerCore
from oceanus.core.types import InferRequest, Tensor
from oceanus.examples import example_repository
from oceanus.examples._graph import make_model

ACCUMULATOR = "accumulator_onnx"


def step(
    model: str, cid: int, value: int, start: bool, end: bool, shape: tuple[int, ...] = (1, 1)
) -> InferRequest:
    data = np.full(shape, value, np.int32)
    parameters = {"sequence_id": cid, "sequence_start": start, "sequence_end": end}
    return InferRequest(
        model, inputs=[Tensor("INPUT", "INT32", shape, data)], parameters=parameters
    )


def with_core(repository: Path, body: Callable[[ServerCore], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        core = ServerCore(CoreOptions(repositories=[repository], backends=builtin.registry()))
        await core.start()
        try:
            return await body(core)
        finally:
            await core.shutdown()

    return asyncio.run(main())


async def sequence(core: ServerCore, cid: int, values: list[int]) -> list[list[Any]]:
    out = []
    for k, value in enumerate(values):
        request = step(ACCUMULATOR, cid, value, k == 0, k == len(values) - 1)
        response = await core.infer(request, "test")
        out.append(response.outputs[0].data.tolist())
    return out


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("state")
    shutil.copytree(example_repository([ACCUMULATOR]) / ACCUMULATOR, root / ACCUMULATOR)
    # Growing state: OUTPUT = OUTPUT_STATE = concat(INPUT_STATE, INPUT); starts as [7, 8].
    grow = root / "grow"
    (grow / "1").mkdir(parents=True)
    (grow / "initial_state").mkdir()
    (grow / "initial_state" / "start.bin").write_bytes(np.array([7, 8], np.int32).tobytes())
    graph = helper.make_graph(
        [
            helper.make_node("Concat", ["INPUT_STATE", "INPUT"], ["OUTPUT"], axis=0),
            helper.make_node("Identity", ["OUTPUT"], ["OUTPUT_STATE"]),
        ],
        "grow",
        [
            helper.make_tensor_value_info("INPUT", TensorProto.INT32, [1]),
            helper.make_tensor_value_info("INPUT_STATE", TensorProto.INT32, ["n"]),
        ],
        [
            helper.make_tensor_value_info("OUTPUT", TensorProto.INT32, ["m"]),
            helper.make_tensor_value_info("OUTPUT_STATE", TensorProto.INT32, ["m"]),
        ],
    )
    onnx.save(make_model(graph), str(grow / "1" / "model.onnx"))
    (grow / "config.pbtxt").write_text(GROW_CONFIG.format(name="grow", initial=GROW_INITIAL))
    return root


GROW_CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ -1 ] }} ]
sequence_batching {{
  state [ {{ input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32
            dims: [ -1 ] {initial} }} ]
}}
"""
GROW_INITIAL = (
    'initial_state { name: "start" data_type: TYPE_INT32 dims: [ 2 ] data_file: "start.bin" }'
)


def test_running_sum_per_sequence_across_concurrent_sequences(repository: Path) -> None:
    async def body(core: ServerCore) -> list[list[list[Any]]]:
        return await asyncio.gather(*(sequence(core, c, [c] * 4) for c in (1, 2, 3, 4)))

    results = with_core(repository, body)
    for cid, sums in zip((1, 2, 3, 4), results, strict=True):
        assert sums == [[[cid * k]] for k in range(1, 5)]


def test_start_resets_the_state(repository: Path) -> None:
    async def body(core: ServerCore) -> list[list[list[Any]]]:
        first = await sequence(core, 9, [5, 5])
        again = await sequence(core, 9, [1, 1])  # the same id, a new START
        return [first, again]

    assert with_core(repository, body) == [[[[5]], [[10]]], [[[1]], [[2]]]]


def test_growing_state_from_a_data_file(repository: Path) -> None:
    async def body(core: ServerCore) -> list[list[int]]:
        out = []
        for k in range(3):
            request = step("grow", 5, k + 1, k == 0, k == 2, shape=(1,))
            out.append((await core.infer(request, "test")).outputs[0].data.tolist())
        return out

    assert with_core(repository, body) == [[7, 8, 1], [7, 8, 1, 2], [7, 8, 1, 2, 3]]


def test_state_tensors_are_not_the_clients(repository: Path) -> None:
    async def body(core: ServerCore) -> list[str]:
        messages = []
        request = step(ACCUMULATOR, 3, 1, True, True)
        request.inputs.append(Tensor("INPUT_STATE", "INT32", (1, 1), np.ones((1, 1), np.int32)))
        for bad in (request,):
            try:
                await core.infer(bad, "test")
            except Exception as exc:
                messages.append(str(exc))
        metadata = core.model_metadata(ACCUMULATOR)
        messages.append(",".join(t["name"] for t in metadata["inputs"] + metadata["outputs"]))
        return messages

    refused, names = with_core(repository, body)
    assert "INPUT_STATE" in refused
    assert names == "INPUT,OUTPUT"


def test_ten_thousand_sequences_leave_nothing_behind(repository: Path) -> None:
    async def body(core: ServerCore) -> tuple[int, int, int]:
        scheduler = core.resolve(ACCUMULATOR).scheduler

        async def batch(first: int) -> None:
            await asyncio.gather(*(sequence(core, c, [1, 2]) for c in range(first, first + 500)))

        tracemalloc.start()
        sizes = []
        for first in range(1, 10_001, 500):
            await batch(first)
            gc.collect()
            sizes.append(tracemalloc.get_traced_memory()[0])
        tracemalloc.stop()
        return len(scheduler._sequences), sizes[3], sizes[-1]  # type: ignore[union-attr]

    alive, warm, end = with_core(repository, body)
    assert alive == 0
    # From 2,000 to 10,000 sequences memory stays flat: 8,000 sequences x 2 requests, where a
    # leak of one state array (~100 B) or sequence per sequence would add ~1 MB or more.
    assert end - warm < 200_000, (warm, end)


@pytest.mark.parametrize(
    ("initial", "message"),
    [
        (
            'initial_state { name: "s" data_type: TYPE_FP32 dims: [ 2 ] zero_data: true }',
            "The data type used for 'initial_state' field of state 'INPUT_STATE' does not match "
            "the state data type.",
        ),
        (
            "initial_state { data_type: TYPE_INT32 dims: [ 2 ] zero_data: true }",
            "Field 'name' must be set when using initial_state for state input 'INPUT_STATE'.",
        ),
        (
            'initial_state { name: "s" data_type: TYPE_INT32 dims: [ 2, 1 ] zero_data: true }',
            "Number of dimensions in 'initial_state' doesn't match the size of 'state' "
            "dimensions for state input 'INPUT_STATE'. 2 != 1",
        ),
        (
            'initial_state { name: "s" data_type: TYPE_INT32 dims: [ -1 ] zero_data: true }',
            "'initial_state' field for state input name 'INPUT_STATE' contains variable "
            "dimensions.",
        ),
        (
            'initial_state { name: "s" data_type: TYPE_INT32 dims: [ 4 ] data_file: "start.bin" }',
            "initial_state setting expects 16 bytes, but the data provided from start.binonly "
            "has 8 bytes.",
        ),
    ],
)
def test_wrong_initial_state_fails_the_load(
    repository: Path, tmp_path: Path, initial: str, message: str
) -> None:
    shutil.copytree(repository / "grow", tmp_path / "bad")
    (tmp_path / "bad" / "config.pbtxt").write_text(GROW_CONFIG.format(name="bad", initial=initial))

    async def body(core: ServerCore) -> list[tuple[str, str]]:
        return core.load_failures()

    failures = with_core(tmp_path, body)
    assert len(failures) == 1 and message in failures[0][1], failures
