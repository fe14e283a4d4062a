"""Decoupled Python models through the core's streaming API (ServerCore.infer_stream), the call
the gRPC frontend's ModelStreamInfer makes for them. The core runs in-process here."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from oceanus.backends import builtin
from oceanus.core.errors import ErrorCode, InferenceServerError
from oceanus.core.server import CoreOptions, ServerCore
from oceanus.core.types import InferRequest, Tensor
from tests.backends.python.conftest import copy_models


def repeat(n: int, **parameters: Any) -> InferRequest:
    array = np.array([n], dtype=np.int32)
    return InferRequest(
        "repeat",
        id=f"r{n}",
        inputs=[Tensor("N", "INT32", (1,), array)],
        parameters=dict(parameters),
    )


def with_core(repository: Path, body: Callable[[ServerCore], Awaitable[None]]) -> None:
    async def main() -> None:
        core = ServerCore(CoreOptions(repositories=[repository], backends=builtin.registry()))
        await core.start()
        try:
            assert core.model_ready("repeat")
            await body(core)
        finally:
            await core.shutdown()

    asyncio.run(main())


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_models(tmp_path_factory.mktemp("stream"), ["repeat", "add_sub"])


def test_stream_of_responses(repository: Path) -> None:
    async def body(core: ServerCore) -> None:
        assert core.is_decoupled("repeat") and not core.is_decoupled("add_sub")
        responses = [r async for r in core.infer_stream(repeat(3))]
        assert [r.outputs[0].data.tolist() for r in responses] == [[0], [1], [2]]
        assert {r.id for r in responses} == {"r3"}
        assert all(r.outputs[0].datatype == "INT32" for r in responses)
        # No response at all: only the final flag, which is not yielded by default ...
        assert [r async for r in core.infer_stream(repeat(0))] == []
        # ... unless the request asks for an empty final response.
        responses = [
            r async for r in core.infer_stream(repeat(2, triton_enable_empty_final_response=True))
        ]
        assert [r.parameters["triton_final_response"] for r in responses] == [False, False, True]
        assert responses[-1].outputs == []
        # The final response may come before execute() is seen to return: wait for the stats.
        for _ in range(200):
            stats = core.statistics("repeat")[0]
            if stats["inference_stats"]["success"]["count"] == 3:
                break
            await asyncio.sleep(0.01)
        assert stats["inference_stats"]["success"]["count"] == 3
        assert stats["inference_stats"]["fail"]["count"] == 0

    with_core(repository, body)


def test_error_response_ends_the_stream(repository: Path) -> None:
    async def body(core: ServerCore) -> None:
        with pytest.raises(InferenceServerError) as info:
            async for _ in core.infer_stream(repeat(-1)):
                pass
        assert info.value.code is ErrorCode.INVALID_ARG
        assert info.value.message == "negative count"

    with_core(repository, body)


def test_one_response_calls_refuse_decoupled_models(repository: Path) -> None:
    async def body(core: ServerCore) -> None:
        with pytest.raises(InferenceServerError) as info:
            core.infer(repeat(1), caller="ModelInfer RPC")
        assert info.value.code is ErrorCode.UNSUPPORTED
        assert info.value.message == (
            "ModelInfer RPC doesn't support models with decoupled transaction policy"
        )
        # infer_stream also serves ordinary models: one response.
        a = np.ones((1, 4), dtype=np.float32)
        request = InferRequest(
            "add_sub",
            inputs=[Tensor("INPUT0", "FP32", (1, 4), a), Tensor("INPUT1", "FP32", (1, 4), a)],
        )
        responses = [r async for r in core.infer_stream(request)]
        assert len(responses) == 1
        assert responses[0].outputs[0].data.tolist() == [[2, 2, 2, 2]]

    with_core(repository, body)


def test_many_streams_at_once(repository: Path) -> None:
    async def body(core: ServerCore) -> None:
        async def collect(n: int) -> list[int]:
            return [int(r.outputs[0].data[0]) async for r in core.infer_stream(repeat(n))]

        results = await asyncio.gather(*(collect(n) for n in range(1, 21)))
        assert results == [list(range(n)) for n in range(1, 21)]

    with_core(repository, body)
