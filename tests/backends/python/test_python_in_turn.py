"""A queue of one-request executions for a model.py (core/scheduling: handed to the instance
thread as a group; backends/python: the group's batches sent to the stub before the first is
answered). Each request is still its own `execute`, in arrival order, and each execution's
compute time is its own, not the wait behind the ones sent before it. In-process core."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from oceanus.backends import builtin
from oceanus.core.server import CoreOptions, ServerCore
from oceanus.core.types import InferRequest, InferResponse, Tensor
from tests.backends.python.conftest import copy_models

MS = 1_000_000
REQUESTS = 6
WARM_UP = 4


def request(value: int) -> InferRequest:
    array = np.array([value], dtype=np.int32)
    return InferRequest("in_turn", id=f"r{value}", inputs=[Tensor("IN", "INT32", (1,), array)])


def test_queued_requests_execute_one_each_in_order_with_their_own_compute_time(
    tmp_path: Path,
) -> None:
    repository = copy_models(tmp_path, ["in_turn"])

    async def main() -> None:
        core = ServerCore(CoreOptions(repositories=[repository], backends=builtin.registry()))
        await core.start()
        try:
            # Cheap executions first: the scheduler hands groups only to a cheap instance (the
            # first of the slow ones below raises the mean by at most a fifth).
            for value in range(-WARM_UP, 0):
                assert isinstance(await core.infer(request(value), "test"), InferResponse)
            responses = await asyncio.gather(
                *(core.infer(request(v), "test") for v in range(REQUESTS))
            )
            stats = core.statistics("in_turn")[0]
        finally:
            await core.shutdown()
        rows = []
        for response in responses:
            assert isinstance(response, InferResponse)
            rows.append(response.outputs[0].data.tolist())
        # [IN, the execute's index, requests it got]: one each, in arrival order
        assert rows == [[v, WARM_UP + v, 1] for v in range(REQUESTS)]
        assert stats["execution_count"] == WARM_UP + REQUESTS
        infer_ns = stats["inference_stats"]["compute_infer"]["ns"]
        # Each execute sleeps 25 ms: 150 ms in all. Counting the wait behind the executions
        # sent before it would make the five that queued behind the first 25+50+...+125 ms.
        assert 25 * MS * REQUESTS <= infer_ns < 300 * MS, infer_ns

    asyncio.run(main())
