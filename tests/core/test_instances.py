"""Instance groups and where batches execute (core/scheduling/instance.py,
core/repository/loader.py), in process:
requests spread over a model's instances, Triton's instance names, one failing instance, and
cheap models' batches moving onto the event loop (docs/architecture.md, "Cheap models execute
on the loop")."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest

from oceanus.core.errors import ErrorCode, InferenceServerError, internal
from oceanus.core.server import ServerCore
from oceanus.core.types import InferResponse
from tests.core.fakes import IO_FP32, World, outcome, rows

LOOP_THREAD = threading.main_thread().name  # asyncio.run runs the loop on the main thread


def test_concurrent_requests_execute_on_different_instances_at_once(world: World) -> None:
    world.add("m", IO_FP32 + "instance_group [ { count: 3 kind: KIND_CPU } ]", max_batch_size=8)
    model = world.model("m")
    model.hold()

    async def scenario(core: ServerCore) -> None:
        futures = [core.infer(world.request("m", rows(1, i)), "test") for i in range(3)]
        executing = await model.wait_executions(3)  # all three held at the same time
        names = ["m_0_0", "m_0_1", "m_0_2"]  # group "m_0" (unnamed, the first), instances
        assert sorted(e.instance for e in executing) == names
        assert sorted(e.thread for e in executing) == names
        model.release_all()
        for future in futures:
            assert isinstance(await outcome(future), InferResponse)

    world.run(scenario)


def test_instances_are_named_as_triton_names_them(world: World) -> None:
    """A named group gives its name; an unnamed one "<model>_<index>"; KIND_GPU without a GPU
    runs on the CPU."""
    world.add(
        "m",
        IO_FP32 + 'instance_group [ { name: "a" count: 1 kind: KIND_CPU }, '
        "{ count: 2 kind: KIND_GPU } ]",
        max_batch_size=8,
    )
    model = world.model("m")
    model.hold()

    async def scenario(core: ServerCore) -> None:
        futures = [core.infer(world.request("m", rows()), "test") for _ in range(3)]
        executing = await model.wait_executions(3)
        assert sorted(e.instance for e in executing) == ["a_0", "m_1_0", "m_1_1"]
        model.release_all()
        for future in futures:
            await outcome(future)
        config = core.model_config("m")
        assert [g.name for g in config.instance_group] == ["a", "m_1"]

    world.run(scenario, load_threads=1)


def test_one_failing_instance_fails_its_batches_only(world: World) -> None:
    world.add("m", IO_FP32 + "instance_group [ { count: 2 kind: KIND_CPU } ]", max_batch_size=8)
    model = world.model("m")
    model.failing_instances["m_0_0"] = RuntimeError("boom")
    model.hold()

    async def scenario(core: ServerCore) -> None:
        futures = [core.infer(world.request("m", rows(1, i)), "test") for i in range(2)]
        executing = await model.wait_executions(2)
        model.release_all()
        # Which request went where is the scheduler's choice: each carries its index.
        on = {e.instance: futures[int(e.inputs["IN"][0, 0])] for e in executing}
        failed, served = await outcome(on["m_0_0"]), await outcome(on["m_0_1"])
        assert isinstance(failed, InferenceServerError)
        assert failed.code == ErrorCode.INTERNAL
        assert failed.message == (
            "Failed to process the request(s) for model 'm_0_0', message: RuntimeError: boom"
        )
        assert isinstance(served, InferResponse)
        assert core.model_ready("m")
        stats = core.statistics("m")[0]
        assert stats["execution_count"] == 2  # a failed execution still counts, as in Triton
        assert (stats["inference_stats"]["success"]["count"], stats["inference_count"]) == (1, 1)
        assert stats["inference_stats"]["fail"]["count"] == 1
        version = core.resolve("m")
        assert version.stats.failures_by_reason["BACKEND"] == 1

    world.run(scenario)


def test_a_backend_error_keeps_its_code(world: World) -> None:
    world.add("m", IO_FP32, max_batch_size=8)
    world.model("m").next_failures.append(
        InferenceServerError(ErrorCode.INVALID_ARG, "the model says no")
    )

    async def scenario(core: ServerCore) -> None:
        error = await outcome(core.infer(world.request("m", rows()), "test"))
        assert isinstance(error, InferenceServerError)
        assert (error.code, error.message) == (ErrorCode.INVALID_ARG, "the model says no")
        # the next execution succeeds: the instance keeps serving
        assert isinstance(
            await outcome(core.infer(world.request("m", rows()), "test")), InferResponse
        )
        assert core.resolve("m").stats.failures_by_reason["OTHER"] == 1

    world.run(scenario)


def test_outputs_whose_rows_do_not_match_the_batch_fail_it(world: World) -> None:
    world.add("m", IO_FP32 + "dynamic_batching { }", max_batch_size=8)
    model = world.model("m")
    model.compute = lambda inputs, _: {"OUT": np.zeros((1, 4), np.float32)}
    model.hold()

    async def scenario(core: ServerCore) -> None:
        first = core.infer(world.request("m", rows()), "test")
        await model.wait_executions(1)
        batch = [core.infer(world.request("m", rows()), "test") for _ in range(2)]
        model.release_all()
        assert isinstance(await outcome(first), InferResponse)  # a batch of one is not split
        expected = internal(
            "output 'OUT' of batch size 2 has shape [1, 4]: its first dimension must be the "
            "batch size"
        )
        for future in batch:
            error = await outcome(future)
            assert isinstance(error, InferenceServerError)
            assert error.message == expected.message

    world.run(scenario)


def test_cheap_batches_move_onto_the_loop_other_backends_never_do(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """The first two batches run on the instance's thread (warm-up, then a first measurement);
    once measured as cheap, batches run on the loop. Wall time decides, and a preempted run
    on a loaded machine sends a few batches back to the thread (the safe direction): hence
    "most", not "all". A backend that is not loop-safe never runs there."""
    world.add("cheap", IO_FP32 + "dynamic_batching { }", backend="fake_cheap", max_batch_size=8)
    world.add("thread", IO_FP32 + "dynamic_batching { }", max_batch_size=8)

    async def scenario(core: ServerCore) -> None:
        for _ in range(40):
            await core.infer(world.request("cheap", rows()), "test")
            await core.infer(world.request("thread", rows()), "test")
        cheap = [e.thread for e in world.model("cheap").executed]
        assert cheap[:2] == ["cheap_0", "cheap_0"]
        assert cheap[2:].count(LOOP_THREAD) >= 19
        assert {e.thread for e in world.model("thread").executed} == {"thread_0"}
        # --log-verbose 1 says where each batch ran
        on_loop = [r for r in caplog.messages if "on the event loop" in r]
        assert len(on_loop) == cheap.count(LOOP_THREAD)
        assert all("for 'cheap'" in line for line in on_loop)

    caplog.set_level(logging.DEBUG, logger="oceanus.core.scheduler")
    world.run(scenario)


def test_lone_requests_of_unbatched_cheap_models_execute_in_place(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """Without dynamic batching nothing can join a request's batch: once a cheap model runs on
    the loop, a request that finds the queue empty is answered inside `infer`. With dynamic
    batching it always waits for the loop's next turn (others may still join its batch)."""
    world.add("plain", IO_FP32, backend="fake_cheap", max_batch_size=8)
    world.add("batching", IO_FP32 + "dynamic_batching { }", backend="fake_cheap", max_batch_size=8)

    async def scenario(core: ServerCore) -> None:
        answered_at_once = {"plain": 0, "batching": 0}
        for _ in range(40):
            for name in answered_at_once:
                future = core.infer(world.request(name, rows()), "test")
                answered_at_once[name] += future.done()
                await future
        on_loop = [e for e in world.model("plain").executed if e.thread == LOOP_THREAD]
        assert on_loop and answered_at_once["plain"] == len(on_loop)
        assert answered_at_once["batching"] == 0
        in_place = [r for r in caplog.messages if "executes in place" in r]
        assert len(in_place) == len(on_loop)
        assert all("for 'plain'" in line for line in in_place)

    caplog.set_level(logging.DEBUG, logger="oceanus.core.scheduler")
    world.run(scenario)
