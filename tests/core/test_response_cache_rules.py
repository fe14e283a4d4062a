"""Triton's response cache (core/response_cache.py), in process over fake-backend models: hits
skip execution and count as Triton counts them, requested outputs are part of the key, LRU
eviction by bytes, responses larger than the cache, ensembles, decoupled models refused, and a
model asking for a cache the server does not have. The cache over HTTP, gRPC and /metrics stays
in tests/wire/test_response_cache.py."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from oceanus.core.server import ServerCore
from oceanus.core.types import RequestedOutput
from tests.core.fakes import World

CACHE_ON = "response_cache { enable: true }\n"
# Shaped like `simple`: two 16 x INT32 outputs, 128 bytes a response (+ 64 bytes of overhead).
IO = """
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
"""
WRAP = """
name: "wrap"
platform: "ensemble"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 16 ] } ]
ensemble_scheduling { step [ { model_name: "plain" model_version: -1
  input_map { key: "INPUT0" value: "INPUT0" } input_map { key: "INPUT1" value: "INPUT1" }
  output_map { key: "OUTPUT0" value: "SUM" } } ] }
response_cache { enable: true }
"""


def inputs(offset: int) -> dict[str, np.ndarray]:
    return {
        "INPUT0": np.arange(16, dtype=np.int32).reshape(1, 16) + offset,
        "INPUT1": np.ones((1, 16), dtype=np.int32),
    }


def counts(core: ServerCore, model: str) -> tuple[int, int, int]:
    """(cache hits, cache misses, executions)"""
    entry = core.statistics(model)[0]
    stats = entry["inference_stats"]
    return stats["cache_hit"]["count"], stats["cache_miss"]["count"], entry["execution_count"]


@pytest.fixture
def cached(world: World) -> World:
    world.add("cached", IO + CACHE_ON, max_batch_size=8)
    world.add("plain", IO, max_batch_size=8)
    return world


def test_hits_skip_execution_and_answer_as_the_first_response(cached: World) -> None:
    async def scenario(core: ServerCore) -> None:
        first = await core.infer(cached.request("cached", inputs(1), id="a"), "test")
        second = await core.infer(cached.request("cached", inputs(1), id="b"), "test")
        assert second.id == "b"
        for one, other in zip(first.outputs, second.outputs, strict=True):
            assert (one.name, one.shape) == (other.name, other.shape)
            assert np.array_equal(one.data, other.data)
        assert counts(core, "cached") == (1, 1, 1)
        entry = core.statistics("cached")[0]
        assert entry["inference_stats"]["success"]["count"] == 2
        assert entry["inference_count"] == 1  # a hit is a success, not an inference
        await core.infer(cached.request("cached", inputs(2)), "test")
        assert counts(core, "cached") == (1, 2, 2)
        for _ in range(2):
            await core.infer(cached.request("plain", inputs(1)), "test")
        assert counts(core, "plain") == (0, 0, 2)

    cached.run(scenario, response_cache_size=1 << 20)


def test_requested_outputs_are_part_of_the_key(cached: World) -> None:
    async def scenario(core: ServerCore) -> None:
        wanted = [RequestedOutput("OUTPUT1")]
        one = await core.infer(cached.request("cached", inputs(3), outputs=wanted), "test")
        both = await core.infer(cached.request("cached", inputs(3)), "test")
        again = await core.infer(cached.request("cached", inputs(3), outputs=wanted), "test")
        assert [t.name for t in one.outputs] == [t.name for t in again.outputs] == ["OUTPUT1"]
        assert [t.name for t in both.outputs] == ["OUTPUT0", "OUTPUT1"]
        assert counts(core, "cached") == (1, 2, 2)

    cached.run(scenario, response_cache_size=1 << 20)


def test_least_recently_used_responses_are_evicted(cached: World) -> None:
    async def scenario(core: ServerCore) -> None:
        async def infer(offset: int) -> None:
            await core.infer(cached.request("cached", inputs(offset)), "test")

        for offset in (1, 2, 3):  # 400 bytes hold two responses: 3 evicts 1
            await infer(offset)
        assert counts(core, "cached") == (0, 3, 3)
        await infer(3)  # a hit, now the most recent
        await infer(1)  # a miss (evicted); evicts 2
        assert counts(core, "cached") == (1, 4, 4)
        await infer(3)
        await infer(2)  # evicted
        assert counts(core, "cached") == (2, 5, 5)

    cached.run(scenario, response_cache_size=400)


def test_a_response_larger_than_the_cache_is_not_stored(cached: World) -> None:
    async def scenario(core: ServerCore) -> None:
        for _ in range(2):
            await core.infer(cached.request("cached", inputs(5)), "test")
        assert counts(core, "cached") == (0, 2, 2)

    cached.run(scenario, response_cache_size=100)


def test_an_ensemble_hit_runs_no_step(cached: World) -> None:
    (cached.repository / "wrap" / "1").mkdir(parents=True)
    (cached.repository / "wrap" / "config.pbtxt").write_text(WRAP)

    async def scenario(core: ServerCore) -> None:
        first = await core.infer(cached.request("wrap", inputs(9)), "test")
        second = await core.infer(cached.request("wrap", inputs(9)), "test")
        assert np.array_equal(first.outputs[0].data, second.outputs[0].data)
        stats = core.statistics("wrap")[0]["inference_stats"]
        assert (stats["cache_hit"]["count"], stats["cache_miss"]["count"]) == (1, 1)
        assert counts(core, "plain") == (0, 0, 1)

    cached.run(scenario, response_cache_size=1 << 20)


def test_decoupled_models_that_enable_it_are_refused(world: World) -> None:
    world.add(
        "repeat",
        IO + CACHE_ON + "model_transaction_policy { decoupled: true }\n",
        backend="fake_requests",
    )

    async def scenario(core: ServerCore) -> str:
        return str(core.repository_index()[0]["reason"])

    assert world.run(scenario, response_cache_size=1 << 20) == (
        "Response Cache does not currently support model with decoupled transaction policy"
    )


def test_without_a_server_cache_a_model_runs_uncached_with_a_warning(
    cached: World, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario(core: ServerCore) -> None:
        for _ in range(2):
            await core.infer(cached.request("cached", inputs(5)), "test")
        assert counts(core, "cached") == (0, 0, 2)

    caplog.set_level(logging.WARNING, logger="oceanus.core")
    cached.run(scenario)
    assert any(
        "model 'cached' version 1 enables the response cache, but the server's response cache "
        "is not configured" in message
        for message in caplog.messages
    )
