"""Triton's dynamic batcher (core/scheduling/dynamic_batch.py, docs/architecture.md "Scheduling"),
in process:
the real ServerCore over fake-backend models whose executions the test holds and releases, and
a manual clock for max_queue_delay and queue timeouts. The wire's side of these rules (HTTP
503 with Triton's texts, client disconnects) is tests/wire/test_dynamic_batching.py's."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from oceanus.core.errors import ErrorCode, InferenceServerError
from oceanus.core.server import ServerCore
from oceanus.core.types import InferResponse
from tests.core.fakes import IO_FP32, World, outcome, rows, scheduler_of, until

VARIABLE_IO = """
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


def value_of(result: InferResponse | InferenceServerError) -> float:
    assert isinstance(result, InferResponse), result
    return float(result.outputs[0].data.reshape(-1)[0])


def executed_values(world: World, model: str) -> list[list[float]]:
    """The first element of each row of every batch the model executed, batch by batch."""
    return [e.inputs["IN"][:, 0].tolist() for e in world.model(model).executed]


def test_preferred_size_is_sent_at_once_smaller_batches_wait_for_the_delay(world: World) -> None:
    world.add(
        "m",
        IO_FP32 + "dynamic_batching { preferred_batch_size: [ 4 ] "
        "max_queue_delay_microseconds: 600000 }",
        max_batch_size=8,
    )

    async def scenario(core: ServerCore) -> None:
        scheduler = scheduler_of(core, "m")
        four = [core.infer(world.request("m", rows(1, i)), "test") for i in range(4)]
        assert scheduler.queued_count == 0  # a preferred size: no waiting for the delay
        assert [value_of(await outcome(f)) for f in four] == [0, 1, 2, 3]
        assert world.model("m").batch_rows() == [4]

        two = [core.infer(world.request("m", rows(1, i)), "test") for i in (5, 6)]
        world.clock.advance_us(599_999)
        assert scheduler.queued_count == 2  # the oldest has not waited 600 ms yet
        world.clock.advance_us(1)
        assert [value_of(await outcome(f)) for f in two] == [5, 6]
        assert world.model("m").batch_rows() == [4, 2]

    world.run(scenario)


def test_rows_count_toward_the_batch_and_outputs_are_split_per_request(world: World) -> None:
    world.add(
        "m",
        IO_FP32 + "dynamic_batching { preferred_batch_size: [ 4 ] "
        "max_queue_delay_microseconds: 600000 }",
        max_batch_size=8,
    )

    async def scenario(core: ServerCore) -> None:
        three = core.infer(world.request("m", rows(3, 2.0)), "test")
        one = core.infer(world.request("m", rows(1, 5.0)), "test")
        first, second = await outcome(three), await outcome(one)
        assert isinstance(first, InferResponse) and isinstance(second, InferResponse)
        assert first.outputs[0].data.tolist() == [[2.0] * 4] * 3
        assert second.outputs[0].data.tolist() == [[5.0] * 4]
        stats = core.statistics("m")[0]
        assert (stats["inference_count"], stats["execution_count"]) == (4, 1)

    world.run(scenario)


def test_a_busy_instance_lets_the_queue_grow_into_batches_of_at_most_max(world: World) -> None:
    """No delay: whatever is queued when the instance frees up goes, up to max_batch_size."""
    world.add("m", IO_FP32 + "dynamic_batching { }", max_batch_size=4)
    model = world.model("m")
    model.hold()

    async def scenario(core: ServerCore) -> None:
        futures = [core.infer(world.request("m", rows(1, i)), "test") for i in range(7)]
        await model.wait_executions(1)
        assert scheduler_of(core, "m").queued_count == 6
        model.release_all()
        assert [value_of(await outcome(f)) for f in futures] == list(range(7))
        assert executed_values(world, "m") == [[0], [1, 2, 3, 4], [5, 6]]

    world.run(scenario)


def test_before_the_delay_runs_out_only_a_preferred_cut_is_sent(world: World) -> None:
    """Five queued, preferred sizes 2 and 4: the batch is cut at 4 and the fifth waits for
    its own max_queue_delay; a batch that would outgrow the largest preferred size is cut
    before it."""
    world.add(
        "m",
        IO_FP32 + "dynamic_batching { preferred_batch_size: [ 2, 4 ] "
        "max_queue_delay_microseconds: 1000000 }",
        max_batch_size=8,
    )
    model = world.model("m")
    model.hold()

    async def scenario(core: ServerCore) -> None:
        scheduler = scheduler_of(core, "m")
        first = core.infer(world.request("m", rows(2, 0.0)), "test")  # preferred: goes now
        await model.wait_executions(1)
        waiting = [core.infer(world.request("m", rows(1, i)), "test") for i in range(1, 6)]
        model.release_all()
        await outcome(first)
        await model.wait_executions(2)
        assert executed_values(world, "m")[1] == [1, 2, 3, 4]
        assert scheduler.queued_count == 1  # the fifth waits for its delay
        pair = core.infer(world.request("m", rows(2, 7.0)), "test")
        assert scheduler.queued_count == 2  # 3 rows: no preferred size, under the largest
        last = core.infer(world.request("m", rows(2, 8.0)), "test")  # 5 rows would outgrow 4
        assert [value_of(await outcome(f)) for f in (waiting[4], pair, last)] == [5, 7, 8]
        assert executed_values(world, "m")[2:] == [[5, 7, 7], [8, 8]]

    world.run(scenario)


def test_requests_of_different_shapes_are_never_merged(world: World) -> None:
    world.add(
        "m",
        VARIABLE_IO
        + "dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 300000 }",
        max_batch_size=8,
    )

    async def scenario(core: ServerCore) -> None:
        narrow = core.infer(world.request("m", rows(1, 1.0, width=3)), "test")
        wide = core.infer(world.request("m", rows(1, 2.0, width=5)), "test")
        assert value_of(await outcome(narrow)) == 1.0  # sent as soon as the next cannot join
        world.clock.advance_us(300_000)  # the wide one waited alone for its delay
        result = await outcome(wide)
        assert isinstance(result, InferResponse) and result.outputs[0].shape == (1, 5)
        assert world.model("m").batch_rows() == [1, 1]

    world.run(scenario)


def test_priority_levels_are_served_highest_first(world: World) -> None:
    world.add(
        "m",
        IO_FP32 + "dynamic_batching { priority_levels: 2 default_priority_level: 2 }",
        max_batch_size=1,
    )
    model = world.model("m")
    model.hold()

    async def scenario(core: ServerCore) -> None:
        def send(value: float, priority: int | None) -> asyncio.Future[InferResponse]:
            parameters = {} if priority is None else {"priority": priority}
            return core.infer(world.request("m", rows(1, value), parameters=parameters), "test")

        running = send(0, None)
        await model.wait_executions(1)
        # 9 is out of range and 0 means "default": both queue at the default level (2).
        queued = [send(1, None), send(2, 1), send(3, 9), send(4, 1), send(5, 0)]
        model.release_all()
        for future in [running, *queued]:
            await outcome(future)
        assert executed_values(world, "m") == [[0], [2], [4], [1], [3], [5]]

    world.run(scenario)


def test_max_queue_size_refuses_at_once_and_is_not_counted(world: World) -> None:
    world.add(
        "m",
        IO_FP32 + "dynamic_batching { default_queue_policy { max_queue_size: 1 } }",
        max_batch_size=8,
    )
    model = world.model("m")
    model.hold()

    async def scenario(core: ServerCore) -> None:
        running = core.infer(world.request("m", rows()), "test")
        await model.wait_executions(1)
        queued = core.infer(world.request("m", rows()), "test")
        for request_id, shown in (("", "<id_unknown>"), ("r3", "r3")):
            with pytest.raises(InferenceServerError) as refused:
                core.infer(world.request("m", rows(), id=request_id), "test")
            assert refused.value.code == ErrorCode.UNAVAILABLE
            assert refused.value.message == f"[request id: {shown}] Exceeds maximum queue size"
        model.release_all()
        await outcome(running)
        await outcome(queued)
        stats = core.statistics("m")[0]["inference_stats"]
        assert (stats["success"]["count"], stats["fail"]["count"]) == (2, 0)

    world.run(scenario)


def test_queue_timeout_rejects_requests_still_queued(world: World) -> None:
    world.add(
        "m",
        IO_FP32 + "dynamic_batching { default_queue_policy { timeout_action: REJECT "
        "default_timeout_microseconds: 1000 } }",
        max_batch_size=1,
    )
    model = world.model("m")
    model.hold()

    async def scenario(core: ServerCore) -> None:
        running = core.infer(world.request("m", rows(1, 0)), "test")
        await model.wait_executions(1)
        late = core.infer(world.request("m", rows(1, 1)), "test")
        world.clock.advance_us(999)
        in_time = core.infer(world.request("m", rows(1, 2)), "test")
        world.clock.advance_us(1)  # `late` waited its 1000 us, `in_time` 1 us
        model.release_all()
        assert value_of(await outcome(running)) == 0
        error = await outcome(late)
        assert isinstance(error, InferenceServerError)
        assert (error.code, error.message) == (ErrorCode.UNAVAILABLE, "Request timeout expired")
        assert value_of(await outcome(in_time)) == 2
        assert executed_values(world, "m") == [[0], [2]]
        stats = core.statistics("m")[0]["inference_stats"]
        assert (stats["success"]["count"], stats["fail"]["count"]) == (2, 1)

    world.run(scenario)


def test_a_request_timeout_may_only_shorten_the_default(world: World) -> None:
    world.add(
        "m",
        IO_FP32 + "dynamic_batching { default_queue_policy { timeout_action: REJECT "
        "default_timeout_microseconds: 30000000 allow_timeout_override: true } }",
        max_batch_size=1,
    )
    model = world.model("m")
    model.hold()

    async def scenario(core: ServerCore) -> None:
        def send(value: float, timeout: int | None) -> asyncio.Future[InferResponse]:
            parameters = {} if timeout is None else {"timeout": timeout}
            return core.infer(world.request("m", rows(1, value), parameters=parameters), "test")

        running = send(0, None)
        await model.wait_executions(1)
        short, longer = send(1, 1000), send(2, 60_000_000)
        world.clock.advance_us(1000)
        model.release(1)  # `short` expired (1 ms); `longer` (30 s, not 60 s) has not
        assert isinstance(await outcome(short), InferenceServerError)
        await model.wait_executions(2)
        default, capped = send(3, None), send(4, 60_000_000)
        world.clock.advance_us(30_000_000)  # both waited 30 s: the default, and the cap
        model.release_all()
        assert [value_of(await outcome(f)) for f in (running, longer)] == [0, 2]
        for future in (default, capped):
            error = await outcome(future)
            assert isinstance(error, InferenceServerError)
            assert error.message == "Request timeout expired"
        assert executed_values(world, "m") == [[0], [2]]

    world.run(scenario)


def test_delay_action_serves_expired_requests_after_the_others(world: World) -> None:
    world.add(
        "m",
        IO_FP32 + "dynamic_batching { default_queue_policy { timeout_action: DELAY "
        "default_timeout_microseconds: 1000 } }",
        max_batch_size=1,
    )
    model = world.model("m")
    model.hold()

    async def scenario(core: ServerCore) -> None:
        running = core.infer(world.request("m", rows(1, 0)), "test")
        await model.wait_executions(1)
        expired = core.infer(world.request("m", rows(1, 1)), "test")
        world.clock.advance_us(1000)
        fresh = core.infer(world.request("m", rows(1, 2)), "test")
        model.release_all()
        assert [value_of(await outcome(f)) for f in (running, expired, fresh)] == [0, 1, 2]
        assert executed_values(world, "m") == [[0], [2], [1]]

    world.run(scenario)


def test_cancelled_requests_leave_the_queue_and_count_as_failures(world: World) -> None:
    world.add("m", IO_FP32 + "dynamic_batching { }", max_batch_size=8)
    model = world.model("m")
    model.hold()

    async def scenario(core: ServerCore) -> None:
        running = core.infer(world.request("m", rows(1, 0)), "test")
        await model.wait_executions(1)
        gone = core.infer(world.request("m", rows(1, 1)), "test")
        kept = core.infer(world.request("m", rows(1, 2)), "test")
        gone.cancel()  # what a frontend does when its client disconnects
        running.cancel()  # executing: it finishes, its result is dropped
        model.release_all()
        assert value_of(await outcome(kept)) == 2
        assert executed_values(world, "m") == [[0], [2]]
        stats = core.statistics("m")[0]
        assert stats["inference_stats"]["success"]["count"] == 1
        assert stats["inference_stats"]["fail"]["count"] == 2
        assert stats["execution_count"] == 2
        assert scheduler_of(core, "m").pending_count == 0

    world.run(scenario)


def test_preserve_ordering_answers_in_arrival_order(world: World) -> None:
    """Two instances, the first request's batch finishes last: with preserve_ordering its
    response still comes first, and the second waits for it."""
    world.add(
        "m",
        IO_FP32 + "dynamic_batching { preserve_ordering: true }\n"
        "instance_group [ { count: 2 kind: KIND_CPU } ]",
        max_batch_size=1,
    )
    model = world.model("m")
    model.hold()

    async def scenario(core: ServerCore) -> None:
        first = core.infer(world.request("m", rows(1, 1)), "test")
        second = core.infer(world.request("m", rows(1, 2)), "test")
        executed = await model.wait_executions(2)
        second_on = next(e.instance for e in executed if e.inputs["IN"][0, 0] == 2)
        model.release(instance=second_on)
        await until(lambda: core.statistics("m")[0]["execution_count"] == 1)
        assert not second.done()  # executed, its answer waits for the first request's
        model.release_all()
        assert [value_of(await outcome(f)) for f in (first, second)] == [1, 2]

    world.run(scenario)


def test_without_dynamic_batching_each_request_is_its_own_batch(world: World) -> None:
    world.add("m", IO_FP32, max_batch_size=8)
    model = world.model("m")
    model.hold()

    async def scenario(core: ServerCore) -> None:
        futures = [core.infer(world.request("m", rows(1, i)), "test") for i in range(3)]
        await model.wait_executions(1)
        model.release_all()
        assert [value_of(await outcome(f)) for f in futures] == [0, 1, 2]
        assert executed_values(world, "m") == [[0], [1], [2]]

    world.run(scenario)


def test_unloading_fails_queued_requests_with_unavailable(world: World) -> None:
    world.add("m", IO_FP32 + "dynamic_batching { }", max_batch_size=1)
    model = world.model("m")
    model.hold()

    async def scenario(core: ServerCore) -> None:
        running = core.infer(world.request("m", rows(1, 0)), "test")
        await model.wait_executions(1)
        queued = core.infer(world.request("m", rows(1, 1)), "test")
        scheduler_of(core, "m").close()
        error = await outcome(queued)
        assert isinstance(error, InferenceServerError)
        assert (error.code, error.message) == (ErrorCode.UNAVAILABLE, "model is being unloaded")
        with pytest.raises(InferenceServerError, match="model is being unloaded"):
            core.infer(world.request("m", rows(1, 2)), "test")
        model.release_all()
        assert value_of(await outcome(running)) == 0

    world.run(scenario)


def test_responses_carry_the_model_and_request(world: World) -> None:
    world.add("m", IO_FP32, max_batch_size=8, versions=(1, 3))

    async def scenario(core: ServerCore) -> None:
        response = await core.infer(world.request("m", rows(2, 4.0), id="abc"), "test")
        # The default version policy serves the latest version only.
        assert (response.model_name, response.model_version, response.id) == ("m", "3", "abc")
        assert [(t.name, t.datatype, t.shape) for t in response.outputs] == [
            ("OUT", "FP32", (2, 4))
        ]
        assert np.array_equal(response.outputs[0].data, np.full((2, 4), 4.0, np.float32))

    world.run(scenario)


def test_a_queue_of_one_request_executions_goes_to_the_thread_at_once(world: World) -> None:
    """Without dynamic batching each request is its own execution; when several are queued for
    a cheap instance they are handed to its thread together (one hand-off, not one each), and
    each still executes alone, in arrival order."""
    world.add("m", IO_FP32, max_batch_size=8)  # no dynamic_batching: one request each
    model = world.model("m")
    model.execution_ns = 100_000  # on the manual clock: a cheap model

    async def scenario(core: ServerCore) -> None:
        scheduler = scheduler_of(core, "m")
        for i in range(2):  # two executions: the instance's mean cost is now known
            assert value_of(await outcome(core.infer(world.request("m", rows(1, i)), "test"))) == i
        model.hold()
        first = core.infer(world.request("m", rows(1, 10)), "test")
        await model.wait_executions(3)
        queued = [core.infer(world.request("m", rows(1, 11 + i)), "test") for i in range(5)]
        assert scheduler.queued_count == 5
        model.release(1)  # the first finishes: the five leave the queue in one hand-off
        await model.wait_executions(4)
        await until(lambda: scheduler.queued_count == 0)
        assert len(model.executed) == 4  # ... yet only the next one has started
        model.release_all()
        assert value_of(await outcome(first)) == 10
        assert [value_of(await outcome(f)) for f in queued] == [11, 12, 13, 14, 15]
        assert model.batch_rows() == [1] * 8
        assert [e.inputs["IN"][0, 0] for e in model.executed] == [0, 1, 10, 11, 12, 13, 14, 15]
        assert len({e.thread for e in model.executed}) == 1  # the instance's thread

    world.run(scenario)
