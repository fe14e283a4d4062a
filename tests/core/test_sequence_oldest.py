"""The sequence batcher's `oldest` strategy (core/scheduling/sequence_oldest.py) in the core, with
the example accumulator (ONNX Runtime, implicit state): interleaved sequences get their own running
sums, batches form across sequences (the statistics' batch sizes), a preferred batch size with a
queue delay waits for that many ready sequences, max_candidate_sequences bounds a batch, and
wrong configs fail with Triton's texts. Outputs and batch counts of the same scenario on
Triton 2.51 (a Python accumulator): docs/triton-reference-behaviour.md."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from oceanus.backends import builtin
from oceanus.core.server import CoreOptions, ServerCore
from oceanus.core.types import InferRequest, Tensor
from oceanus.examples import example_repository
from oceanus.examples.small_models import ACCUMULATOR_CONFIG, ACCUMULATOR_NAME

OLDEST = "oldest { max_candidate_sequences: 8 preferred_batch_size: [ 8 ] }"


def variant(root: Path, name: str, oldest: str) -> None:
    """The accumulator under another name with another `oldest { }` block."""
    shutil.copytree(
        example_repository([ACCUMULATOR_NAME]) / ACCUMULATOR_NAME / "1", root / name / "1"
    )
    config = ACCUMULATOR_CONFIG.replace(f'"{ACCUMULATOR_NAME}"', f'"{name}"').replace(
        OLDEST, oldest
    )
    (root / name / "config.pbtxt").write_text(config)


def run(root: Path, body: Callable[[ServerCore], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        core = ServerCore(CoreOptions(repositories=[root], backends=builtin.registry()))
        await core.start()
        try:
            return await body(core)
        finally:
            await core.shutdown()

    return asyncio.run(main())


async def sequence(core: ServerCore, model: str, cid: int, values: list[int]) -> list[int]:
    sums = []
    for k, value in enumerate(values):
        parameters = {
            "sequence_id": cid,
            "sequence_start": k == 0,
            "sequence_end": k == len(values) - 1,
        }
        data = np.array([[value]], np.int32)
        request = InferRequest(
            model, inputs=[Tensor("INPUT", "INT32", (1, 1), data)], parameters=parameters
        )
        sums.append(int((await core.infer(request, "test")).outputs[0].data[0, 0]))
    return sums


def batches(core: ServerCore, model: str) -> dict[int, int]:
    stats = core.statistics(model)[0]
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("oldest")
    variant(root, "acc_default", OLDEST)
    variant(
        root,
        "acc_wait4",
        "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 4 ] "
        "max_queue_delay_microseconds: 5000000 }",
    )
    variant(root, "acc_two", "oldest { max_candidate_sequences: 2 }")
    return root


def test_interleaved_sequences_batch_across_sequences(root: Path) -> None:
    async def body(core: ServerCore) -> tuple[list[list[int]], dict[int, int]]:
        cids = range(1, 9)
        values = {c: [c * 10 + k for k in range(5)] for c in cids}
        sums = await asyncio.gather(*(sequence(core, "acc_default", c, values[c]) for c in cids))
        return sums, batches(core, "acc_default")

    sums, sizes = run(root, body)
    for cid, got in zip(range(1, 9), sums, strict=True):
        assert got == list(np.cumsum([cid * 10 + k for k in range(5)]))
    assert sum(size * count for size, count in sizes.items()) == 40
    assert max(sizes) > 1  # a batch held requests of several sequences


def test_preferred_size_and_delay_wait_for_four_sequences(root: Path) -> None:
    # The scenario compared with Triton: 4 sequences of 5 requests, preferred batch 4.
    async def body(core: ServerCore) -> tuple[list[list[int]], dict[int, int]]:
        cids = (1, 2, 3, 4)
        sums = await asyncio.gather(
            *(sequence(core, "acc_wait4", c, [c * 10 + k for k in range(5)]) for c in cids)
        )
        return sums, batches(core, "acc_wait4")

    sums, sizes = run(root, body)
    assert sums == [
        [10, 21, 33, 46, 60],
        [20, 41, 63, 86, 110],
        [30, 61, 93, 126, 160],
        [40, 81, 123, 166, 210],
    ]
    assert sizes == {4: 5}  # as Triton: five executions of four requests


def test_candidates_bound_the_batch_and_the_rest_wait(root: Path) -> None:
    async def body(core: ServerCore) -> tuple[list[list[int]], dict[int, int]]:
        sums = await asyncio.gather(*(sequence(core, "acc_two", c, [c, c, c]) for c in range(1, 6)))
        return sums, batches(core, "acc_two")

    sums, sizes = run(root, body)
    assert sums == [[c, 2 * c, 3 * c] for c in range(1, 6)]
    assert max(sizes) <= 2


@pytest.mark.parametrize(
    ("oldest", "message"),
    [
        (
            "oldest { preferred_batch_size: [ 16 ] }",
            "sequence batching preferred batch size must be <= max batch size for bad",
        ),
        (
            "oldest { preferred_batch_size: [ 0 ] }",
            "sequence batching preferred batch size must be positive for bad",
        ),
    ],
)
def test_wrong_preferred_sizes_fail_the_load(tmp_path: Path, oldest: str, message: str) -> None:
    variant(tmp_path, "bad", oldest)

    async def body(core: ServerCore) -> list[tuple[str, str]]:
        return core.load_failures()

    failures = run(tmp_path, body)
    assert len(failures) == 1 and message in failures[0][1], failures
