"""A queue of one-request executions for a model.py (core/scheduling: handed to the instance
thread as a group; backends/python: the group's batches sent to the stub before the first is
answered). Each request is still its own `execute`, in arrival order, and each execution's
compute time is its own, not the wait behind the ones sent before it. In-process core."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import numpy as np

from oceanus.backends import builtin
from oceanus.core.server import CoreOptions, ServerCore
from oceanus.core.types import InferRequest, InferResponse, Tensor
from oceanus.ipc.rings import shm_dir
from oceanus.ipc.shm_watch import ShmWatch
from tests.backends.python.conftest import copy_models

MS = 1_000_000
REQUESTS = 6
WARM_UP = 4


def request(value: int, elements: int = 1) -> InferRequest:
    array = np.full(elements, value, dtype=np.int32)
    tensor = Tensor("IN", "INT32", (elements,), array)
    return InferRequest("in_turn", id=f"r{value}", inputs=[tensor])


async def warm_up(core: ServerCore) -> None:
    """Cheap executions first: the scheduler hands groups only to a cheap instance (the first
    of the slower ones after them raises the mean by at most a fifth)."""
    for value in range(-WARM_UP, 0):
        assert isinstance(await core.infer(request(value), "test"), InferResponse)


def test_queued_requests_execute_one_each_in_order_with_their_own_compute_time(
    tmp_path: Path,
) -> None:
    repository = copy_models(tmp_path, ["in_turn"])

    async def main() -> None:
        core = ServerCore(CoreOptions(repositories=[repository], backends=builtin.registry()))
        await core.start()
        try:
            await warm_up(core)
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


def test_large_inputs_are_not_sent_ahead_into_the_rings(tmp_path: Path) -> None:
    """Six queued requests of 2 MiB each, 25 ms of execute each: the five behind the first,
    sent ahead together, would fill the ring to the stub while the stub sleeps and grow it again
    and again (or spill to one-off files); a large batch is sent only once the one before it is
    answered: the ring grows once, to hold one, and nothing spills."""
    repository = copy_models(tmp_path, ["in_turn"])
    elements = 512 * 1024  # 2 MiB of INT32

    async def main() -> None:
        core = ServerCore(CoreOptions(repositories=[repository], backends=builtin.registry()))
        await core.start()
        watch = ShmWatch(shm_dir())
        try:
            await warm_up(core)
            big = [core.infer(request(100 + i, elements), "test") for i in range(REQUESTS)]
            responses = await asyncio.gather(*big)
            made = [n for n in watch.created() if n.startswith(f"oceanus-py-{os.getpid()}-")]
        finally:
            watch.close()
            await core.shutdown()
        rows = [r.outputs[0].data.tolist() for r in responses if isinstance(r, InferResponse)]
        assert [row[0] for row in rows] == [100 + i for i in range(REQUESTS)]
        # New segments of the ring to the stub (-s-g<n>): one; one-off files: none.
        assert len([n for n in made if "-s-g" in n]) == 1, made
        assert [n for n in made if "-s-g" not in n and "-w-g" not in n] == []

    asyncio.run(main())


def test_models_with_large_fixed_tensors_keep_the_instance_thread() -> None:
    """Batches of small (or not yet known) tensors go through the event loop; a model whose
    fixed shapes make a batch larger than the share of the ring keeps the instance thread, so
    its copies into and out of the rings do not run on the loop."""
    from tritonclient.grpc import model_config_pb2 as mc

    from oceanus.backends.python.loop_batches import small_tensors

    def config(dims: list[int], max_batch: int = 0, data_type: int = mc.TYPE_FP32) -> Any:
        tensor = {"name": "X", "data_type": data_type, "dims": dims}
        return mc.ModelConfig(max_batch_size=max_batch, input=[tensor], output=[tensor])

    limit = 512 * 1024
    assert small_tensors(config([1, 16]), limit)
    assert not small_tensors(config([1, 1 << 20]), limit)  # 4 MiB in and out
    assert small_tensors(config([16 * 1024]), limit)  # 64 KiB each way
    assert not small_tensors(config([16 * 1024], max_batch=8), limit)  # 8 rows of 64 KiB, twice
    assert small_tensors(config([-1]), limit)  # not known at load
    assert small_tensors(config([1 << 20], data_type=mc.TYPE_STRING), limit)
