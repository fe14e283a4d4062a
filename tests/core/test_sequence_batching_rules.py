"""The sequence batcher's rules (core/scheduling/sequence.py, docs/sequence-batching.md), in
process: slots
and the backlog, control tensors, idle timeouts on a manual clock, Triton's texts for the
common mistakes. What reaches a real model over HTTP and gRPC, and a Python model's own state,
stay in tests/wire/test_sequence_batching.py."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import numpy as np
import pytest

from oceanus.core.errors import ErrorCode, InferenceServerError
from oceanus.core.server import ServerCore
from oceanus.core.types import InferResponse
from tests.core.fakes import World, outcome, scheduler_of

IO = """
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
CONTROLS = """
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
"""


def add_sequence_model(
    world: World,
    name: str = "seq",
    max_batch_size: int = 4,
    batching: str = CONTROLS,
    count: int = 1,
    io: str = IO,
) -> None:
    world.add(
        name,
        io + f"sequence_batching {{ {batching} }}\n"
        f"instance_group [ {{ count: {count} kind: KIND_CPU }} ]\n",
        max_batch_size=max_batch_size,
    )


class Sequences:
    """Sends sequence requests to one model of a running core."""

    def __init__(self, world: World, core: ServerCore, model: str = "seq") -> None:
        self.world, self.core, self.model = world, core, model
        self.batched = (
            world.repository.joinpath(model, "config.pbtxt").read_text().find("max_batch_size: 0")
            < 0
        )

    def send(
        self, corrid: int | str, value: int = 0, **flags: Any
    ) -> asyncio.Future[InferResponse]:
        shape = (1, 1) if self.batched else (1,)
        parameters = {"sequence_id": corrid, **flags}
        inputs = {"INPUT": np.full(shape, value, dtype=np.int32)}
        request = self.world.request(self.model, inputs, parameters=parameters)
        return self.core.infer(request, "test")

    def refused(self, corrid: Any = None, **flags: Any) -> str:
        parameters = {} if corrid is None else {"sequence_id": corrid}
        inputs = {"INPUT": np.ones((1, 1), dtype=np.int32)}
        request = self.world.request(self.model, inputs, parameters={**parameters, **flags})
        with pytest.raises(InferenceServerError) as caught:
            self.core.infer(request, "test")
        assert caught.value.code == ErrorCode.INVALID_ARG
        return caught.value.message


def controls(world: World, model: str = "seq") -> list[dict[str, list[Any]]]:
    """The control tensors (and INPUT) of every batch the model executed, as lists."""
    return [
        {name: array.reshape(-1).tolist() for name, array in e.inputs.items()}
        for e in world.model(model).executed
    ]


def test_control_tensors_carry_each_requests_flags_and_corrid(world: World) -> None:
    add_sequence_model(world)

    async def scenario(core: ServerCore) -> None:
        seq = Sequences(world, core)
        for value, flags in ((5, {"sequence_start": True}), (6, {}), (8, {"sequence_end": True})):
            await seq.send(1001, value, **flags)
        await seq.send(1002, 1, sequence_start=True, sequence_end=True)
        assert controls(world) == [
            {"INPUT": [5], "START": [1], "READY": [1.0], "END": [False], "CORRID": [1001]},
            {"INPUT": [6], "START": [0], "READY": [1.0], "END": [False], "CORRID": [1001]},
            {"INPUT": [8], "START": [0], "READY": [1.0], "END": [True], "CORRID": [1001]},
            {"INPUT": [1], "START": [1], "READY": [1.0], "END": [True], "CORRID": [1002]},
        ]
        first = world.model("seq").executed[0].inputs
        assert {name: (a.dtype.name, a.shape) for name, a in first.items()} == {
            "INPUT": ("int32", (1, 1)),
            "START": ("int32", (1, 1)),
            "READY": ("float32", (1, 1)),
            "END": ("bool", (1, 1)),
            "CORRID": ("uint64", (1, 1)),
        }

    world.run(scenario)


def test_unbatched_models_get_controls_without_a_batch_dimension(world: World) -> None:
    add_sequence_model(world, max_batch_size=0)

    async def scenario(core: ServerCore) -> None:
        await Sequences(world, core).send(7, 3, sequence_start=True)
        assert {
            n: a.shape for n, a in world.model("seq").executed[0].inputs.items()
        } == dict.fromkeys(("INPUT", "START", "READY", "END", "CORRID"), (1,))

    world.run(scenario)


def test_string_correlation_ids(world: World) -> None:
    add_sequence_model(
        world,
        batching='control_input [ { name: "CORRID" control [ '
        "{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] } ]",
    )

    async def scenario(core: ServerCore) -> None:
        seq = Sequences(world, core)
        await seq.send("abc", 1, sequence_start=True, sequence_end=True)
        corrid = world.model("seq").executed[0].inputs["CORRID"]
        assert (corrid.dtype, corrid.tolist()) == (np.dtype(object), [[b"abc"]])
        assert seq.refused(12, sequence_start=True) == (
            "inference request for sequence 12 to model 'seq': correlation ID in request is "
            "not a string"
        )

    world.run(scenario)


def test_mistakes_get_tritons_texts(world: World) -> None:
    add_sequence_model(world)

    async def scenario(core: ServerCore) -> None:
        seq = Sequences(world, core)
        no_id = (
            "inference request to model 'seq' must specify a non-zero or non-empty correlation ID"
        )
        assert seq.refused() == no_id
        assert seq.refused(0) == no_id
        assert seq.refused("") == no_id
        assert seq.refused(True) == no_id  # a boolean is no correlation ID
        assert seq.refused(11) == (
            "inference request for sequence 11 to model 'seq' must specify the START flag on "
            "the first request of the sequence"
        )
        assert "must specify the START flag" in seq.refused(12, sequence_end=True)
        await seq.send(13, sequence_start=True)
        await seq.send(13, sequence_end=True)
        assert "must specify the START flag" in seq.refused(13)  # after its END, it is gone
        assert seq.refused("abc", sequence_start=True) == (
            "inference request for sequence abc to model 'seq': correlation ID in request is "
            "not an unsigned int"
        )
        request = world.request(
            "seq",
            {"INPUT": np.ones((2, 1), np.int32)},
            parameters={"sequence_id": 5, "sequence_start": True},
        )
        with pytest.raises(InferenceServerError) as caught:
            core.infer(request, "test")
        assert caught.value.message == (
            "inference request to model 'seq' must specify batch-size 1 due to requirements of "
            "sequence batcher"
        )
        assert world.model("seq").batch_rows() == [1, 1]  # nothing refused was executed
        stats = core.statistics("seq")[0]["inference_stats"]
        assert (stats["success"]["count"], stats["fail"]["count"]) == (2, 0)

    world.run(scenario)


def test_a_sequence_holds_its_slot_others_wait_in_the_backlog(world: World) -> None:
    """One instance, max_batch_size 1: one slot. A second sequence waits until the first
    ends, even while the instance is idle."""
    add_sequence_model(world, max_batch_size=1)

    async def scenario(core: ServerCore) -> None:
        seq = Sequences(world, core)
        scheduler = scheduler_of(core, "seq")
        await seq.send(1, 10, sequence_start=True)
        waiting = seq.send(2, 20, sequence_start=True)
        await seq.send(1, 11)
        assert scheduler.queued_count == 1 and not waiting.done()
        await seq.send(1, 12, sequence_end=True)
        await outcome(waiting)
        assert [c["INPUT"] for c in controls(world)] == [[10], [11], [12], [20]]

    world.run(scenario)


def test_ready_slots_are_batched_one_request_per_sequence(world: World) -> None:
    add_sequence_model(world, max_batch_size=4)
    model = world.model("seq")
    model.hold()

    async def scenario(core: ServerCore) -> None:
        seq = Sequences(world, core)
        futures = [seq.send(11, 1, sequence_start=True)]
        await model.wait_executions(1)
        futures += [
            seq.send(11, 2),
            seq.send(11, 3, sequence_end=True),
            seq.send(12, 1, sequence_start=True),
            seq.send(13, 1, sequence_start=True),
        ]
        model.release_all()
        for future in futures:
            assert isinstance(await outcome(future), InferResponse)
        # A sequence's requests run in order, one per batch; other sequences share batches.
        assert [c["CORRID"] for c in controls(world)] == [[11], [11, 12, 13], [11]]
        assert [c["INPUT"] for c in controls(world)] == [[1], [2, 1, 1], [3]]

    world.run(scenario)


def test_sequences_spread_over_instances(world: World) -> None:
    add_sequence_model(world, max_batch_size=1, count=2)
    model = world.model("seq")
    model.hold()

    async def scenario(core: ServerCore) -> None:
        seq = Sequences(world, core)
        first = [seq.send(1, sequence_start=True), seq.send(2, sequence_start=True)]
        executing = await model.wait_executions(2)  # both slots run at once
        instances = {e.inputs["CORRID"][0, 0]: e.instance for e in executing}
        assert sorted(instances.values()) == ["seq_0_0", "seq_0_1"]
        model.release_all()
        for future in first:
            await outcome(future)
        await seq.send(1, sequence_end=True)
        await seq.send(2, sequence_end=True)
        later = {e.inputs["CORRID"][0, 0]: e.instance for e in model.executed[2:]}
        assert later == instances  # each sequence stays on its slot's instance

    world.run(scenario)


def test_idle_sequences_are_released_and_give_their_slot_away(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    add_sequence_model(
        world, max_batch_size=1, batching=CONTROLS + "max_sequence_idle_microseconds: 300000"
    )

    async def scenario(core: ServerCore) -> None:
        seq = Sequences(world, core)
        await seq.send(51, 1, sequence_start=True)
        waiting = seq.send(52, 2, sequence_start=True)
        world.clock.advance_us(299_999)
        assert not waiting.done() and scheduler_of(core, "seq").queued_count == 1
        world.clock.advance_us(1)  # sequence 51 has been idle 300 ms: its slot goes to 52
        assert isinstance(await outcome(waiting), InferResponse)
        assert "must specify the START flag" in seq.refused(51)
        await seq.send(52, 3, sequence_end=True)
        assert "sequence 51 for model 'seq' released: idle for more than 300000 us" in (
            caplog.messages
        )

    caplog.set_level(logging.INFO, logger="oceanus.core.sequence")
    world.run(scenario)


def test_an_executing_sequence_is_not_idle(world: World) -> None:
    """A request that executes longer than the idle limit does not idle its sequence out (and
    the idle timer does not spin meanwhile: the manual clock fails on a timer re-armed at a
    time already past)."""
    add_sequence_model(
        world, max_batch_size=1, batching=CONTROLS + "max_sequence_idle_microseconds: 1000"
    )
    model = world.model("seq")
    model.hold()

    async def scenario(core: ServerCore) -> None:
        seq = Sequences(world, core)
        running = seq.send(7, 1, sequence_start=True)
        await model.wait_executions(1)
        world.clock.advance_us(5000)
        model.release_all()
        await outcome(running)
        await seq.send(7, 2)  # still its sequence: no START needed
        world.clock.advance_us(1000)  # idle from its last request's end: released
        assert "must specify the START flag" in seq.refused(7)

    world.run(scenario)


def test_a_sequence_left_without_requests_still_times_out(world: World) -> None:
    """Sequence 2's only request is cancelled while it waits in the backlog; it then gets the
    slot with nothing to run, and must idle out for sequence 3 to be served."""
    add_sequence_model(
        world, max_batch_size=1, batching=CONTROLS + "max_sequence_idle_microseconds: 1000"
    )
    model = world.model("seq")
    model.hold()

    async def scenario(core: ServerCore) -> None:
        seq = Sequences(world, core)
        running = seq.send(1, 1, sequence_start=True, sequence_end=True)
        await model.wait_executions(1)
        seq.send(2, 2, sequence_start=True).cancel()
        waiting = seq.send(3, 3, sequence_start=True)
        model.release_all()
        await outcome(running)
        assert not waiting.done()
        world.clock.advance_us(1000)
        assert isinstance(await outcome(waiting), InferResponse)
        assert [c["CORRID"] for c in controls(world)] == [[1], [3]]

    world.run(scenario)


def test_a_start_on_a_running_sequence_restarts_it(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    add_sequence_model(world)

    async def scenario(core: ServerCore) -> None:
        seq = Sequences(world, core)
        await seq.send(104, 6, sequence_start=True)
        await seq.send(104, 7, sequence_start=True)
        await seq.send(104, 8, sequence_end=True)
        assert [c["START"] for c in controls(world)] == [[1], [1], [0]]
        assert any(
            "sequence 104 for model 'seq' has a conflict. The previous sequence did not end "
            "before this sequence start." in line
            for line in caplog.messages
        )

    world.run(scenario)


def test_cancelled_sequence_requests_leave_the_queue(world: World) -> None:
    add_sequence_model(world, max_batch_size=1)
    model = world.model("seq")
    model.hold()

    async def scenario(core: ServerCore) -> None:
        seq = Sequences(world, core)
        running = seq.send(3, 1, sequence_start=True)
        await model.wait_executions(1)
        gone, kept = seq.send(3, 2), seq.send(3, 3, sequence_end=True)
        gone.cancel()
        model.release_all()
        await outcome(running)
        await outcome(kept)
        assert [c["INPUT"] for c in controls(world)] == [[1], [3]]
        assert core.statistics("seq")[0]["inference_stats"]["fail"]["count"] == 1

    world.run(scenario)


def test_unloading_fails_queued_sequence_requests(world: World) -> None:
    add_sequence_model(world, max_batch_size=1)
    model = world.model("seq")
    model.hold()

    async def scenario(core: ServerCore) -> None:
        seq = Sequences(world, core)
        running = seq.send(3, 1, sequence_start=True)
        await model.wait_executions(1)
        queued, backlog = seq.send(3, 2), seq.send(4, 1, sequence_start=True)
        scheduler_of(core, "seq").close()
        for future in (queued, backlog):
            error = await outcome(future)
            assert isinstance(error, InferenceServerError)
            assert error.message == "model is being unloaded"
        model.release_all()
        assert isinstance(await outcome(running), InferResponse)

    world.run(scenario)
