"""Ensemble routing (core/ensemble/steps.py, docs/ensembles.md), in process over fake-backend
models:
steps run as their inputs exist (independent ones at once), outputs flow step to step, only the
requested outputs come back, a failing or cancelled request leaves its steps' queues, loading
an ensemble loads its composing models, and load errors name the problem. The pipeline over
HTTP, gRPC and a stream stays in tests/wire/test_ensembles.py."""

from __future__ import annotations

import numpy as np
import pytest

from oceanus.core.errors import ErrorCode, InferenceServerError
from oceanus.core.server import ServerCore
from oceanus.core.types import InferResponse, RequestedOutput
from tests.core.fakes import World, outcome

IO = """
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 4 ] } ]
"""


def step(model: str, source: str, target: str, version: int = -1) -> str:
    return (
        f'{{ model_name: "{model}" model_version: {version} '
        f'input_map {{ key: "IN" value: "{source}" }} '
        f'output_map {{ key: "OUT" value: "{target}" }} }}'
    )


def ensemble(name: str, steps: list[str], outputs: tuple[str, ...], max_batch: int = 8) -> str:
    tensors = ", ".join(f'{{ name: "{o}" data_type: TYPE_INT32 dims: [ 4 ] }}' for o in outputs)
    return (
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: {max_batch}\n'
        'input [ { name: "X" data_type: TYPE_INT32 dims: [ 4 ] } ]\n'
        f"output [ {tensors} ]\n"
        f"ensemble_scheduling {{ step [ {', '.join(steps)} ] }}\n"
    )


# X -> double -> D -> inc -> PLUS; X -> inc -> INC (fan-out: X feeds two steps at once)
PIPELINE = ensemble(
    "pipeline",
    [step("double", "X", "D"), step("inc", "D", "PLUS"), step("inc", "X", "INC")],
    ("PLUS", "INC"),
)


def add_ensemble(world: World, name: str, config: str) -> None:
    (world.repository / name / "1").mkdir(parents=True)  # an ensemble's version folder is empty
    (world.repository / name / "config.pbtxt").write_text(config)


@pytest.fixture
def pipeline(world: World) -> World:
    world.add("double", IO, max_batch_size=8)
    world.add("inc", IO, max_batch_size=8)
    world.model("double").compute = lambda inputs, _: {"OUT": inputs["IN"] * 2}
    world.model("inc").compute = lambda inputs, _: {"OUT": inputs["IN"] + 1}
    add_ensemble(world, "pipeline", PIPELINE)
    return world


def x(rows: int = 2) -> dict[str, np.ndarray]:
    return {"X": np.arange(4 * rows, dtype=np.int32).reshape(rows, 4)}


def test_steps_feed_each_other_and_requested_outputs_come_back(pipeline: World) -> None:
    async def scenario(core: ServerCore) -> None:
        response = await core.infer(pipeline.request("pipeline", x(), id="r"), "test")
        given = x()["X"]
        outputs = {t.name: t.data for t in response.outputs}
        assert np.array_equal(outputs["PLUS"], given * 2 + 1)
        assert np.array_equal(outputs["INC"], given + 1)
        assert (response.model_name, response.id) == ("pipeline", "r")
        only = pipeline.request("pipeline", x(), outputs=[RequestedOutput("INC")])
        response = await core.infer(only, "test")
        assert [t.name for t in response.outputs] == ["INC"]
        assert len(pipeline.model("inc").executed) == 4  # every step still ran
        # The ensemble counts its requests (zero compute), each step counts in its model.
        stats = core.statistics("pipeline")[0]
        assert stats["inference_stats"]["success"]["count"] == 2
        assert stats["inference_count"] == 4
        assert stats["inference_stats"]["compute_infer"]["ns"] == 0
        assert core.statistics("inc")[0]["inference_stats"]["success"]["count"] == 4
        assert core.statistics("double")[0]["inference_stats"]["success"]["count"] == 2
        assert core.model_metadata("pipeline")["platform"] == "ensemble"

    pipeline.run(scenario)


def test_independent_steps_run_at_the_same_time(pipeline: World) -> None:
    double, inc = pipeline.model("double"), pipeline.model("inc")
    double.hold()
    inc.hold()

    async def scenario(core: ServerCore) -> None:
        future = core.infer(pipeline.request("pipeline", x()), "test")
        await double.wait_executions(1)
        await inc.wait_executions(1)  # X -> inc runs while X -> double is still running
        assert not future.done()
        double.release_all()
        inc.release_all()
        assert isinstance(await outcome(future), InferResponse)

    pipeline.run(scenario)


def test_a_failing_step_fails_the_request_and_its_other_steps_leave(pipeline: World) -> None:
    double, inc = pipeline.model("double"), pipeline.model("inc")
    double.next_failures.append(InferenceServerError(ErrorCode.INVALID_ARG, "double refuses"))
    inc.hold()

    async def scenario(core: ServerCore) -> None:
        blocker = core.infer(pipeline.request("inc", {"IN": np.zeros((1, 4), np.int32)}), "test")
        await inc.wait_executions(1)  # inc is busy: the ensemble's inc step queues
        error = await outcome(core.infer(pipeline.request("pipeline", x()), "test"))
        assert isinstance(error, InferenceServerError)
        assert (error.code, error.message) == (ErrorCode.INVALID_ARG, "double refuses")
        inc.release_all()
        await outcome(blocker)
        assert len(inc.executed) == 1  # the failed request's inc step left the queue
        stats = core.statistics("pipeline")[0]["inference_stats"]
        assert (stats["success"]["count"], stats["fail"]["count"]) == (0, 1)

    pipeline.run(scenario)


def test_a_cancelled_request_cancels_its_queued_steps(pipeline: World) -> None:
    double = pipeline.model("double")
    double.hold()

    async def scenario(core: ServerCore) -> None:
        blocker = core.infer(pipeline.request("double", {"IN": np.zeros((1, 4), np.int32)}), "test")
        await double.wait_executions(1)
        future = core.infer(pipeline.request("pipeline", x()), "test")
        await pipeline.model("inc").wait_executions(1)  # its X -> inc step ran
        future.cancel()  # the client left
        double.release_all()
        await outcome(blocker)
        await outcome(
            core.infer(pipeline.request("double", {"IN": np.ones((1, 4), np.int32)}), "test")
        )
        assert [e.rows for e in double.executed] == [1, 1]  # its double step never ran
        stats = core.statistics("pipeline")[0]["inference_stats"]
        assert stats["fail"]["count"] == 1
        assert core.resolve("pipeline").stats.failures_by_reason["CANCELED"] == 1

    pipeline.run(scenario)


def test_explicit_loading_brings_the_composing_models(pipeline: World) -> None:
    async def scenario(core: ServerCore) -> None:
        assert not core.model_ready("double")
        await core.load_model("pipeline")
        assert core.model_ready("double") and core.model_ready("inc")
        await core.unload_model("inc")
        assert not core.model_ready("pipeline")  # ready only while its models are
        with pytest.raises(InferenceServerError) as caught:
            await core.infer(pipeline.request("pipeline", x()), "test")
        assert "'inc' has no available versions" in caught.value.message
        stats = core.statistics("pipeline")[0]["inference_stats"]
        assert stats["fail"]["count"] == 1
        await core.load_model("pipeline")  # loads the missing model again
        assert core.model_ready("inc") and core.model_ready("pipeline")

    pipeline.run(scenario, control_mode="explicit")


def test_load_errors_name_the_problem(pipeline: World) -> None:
    pipeline.add(
        "floats",
        IO.replace("TYPE_INT32", "TYPE_FP32"),
        max_batch_size=8,
    )
    pipeline.add("small", IO, max_batch_size=2)
    add_ensemble(
        pipeline,
        "mixed",
        ensemble("mixed", [step("double", "X", "D"), step("floats", "D", "Y")], ("Y",)),
    )
    add_ensemble(pipeline, "too_big", ensemble("too_big", [step("small", "X", "Y")], ("Y",)))
    add_ensemble(pipeline, "ghost", ensemble("ghost", [step("nonexistent", "X", "Y")], ("Y",)))
    add_ensemble(
        pipeline, "pinned", ensemble("pinned", [step("double", "X", "Y", version=4)], ("Y",))
    )
    unwritten = ensemble("unwritten", [step("double", "X", "D")], ("Y",))
    add_ensemble(pipeline, "unwritten", unwritten)
    add_ensemble(
        pipeline,
        "outer",
        ensemble("outer", [step("pipeline", "X", "Y")], ("Y",))
        .replace('key: "IN"', 'key: "X"')
        .replace('key: "OUT"', 'key: "INC"'),
    )
    add_ensemble(pipeline, "loop_a", ensemble("loop_a", [step("loop_b", "X", "Y")], ("Y",)))
    add_ensemble(pipeline, "loop_b", ensemble("loop_b", [step("loop_a", "X", "Y")], ("Y",)))

    async def scenario(core: ServerCore) -> None:
        reasons = {e["name"]: e.get("reason", "") for e in core.repository_index()}
        assert reasons["mixed"] == (
            "in ensemble mixed, ensemble tensor D: inconsistent data type: TYPE_INT32 is "
            "inferred from model double while TYPE_FP32 is inferred from model floats"
        )
        assert reasons["too_big"] == (
            "ensemble too_big allows maximum batch size 8, but it contains model small which "
            "only allows maximum batch size to be 2"
        )
        assert reasons["ghost"] == (
            "ensemble 'ghost' depends on 'nonexistent' which has no loaded version. Model "
            "'nonexistent' loading failed with error: failed to load 'nonexistent', failed to "
            "poll from model repository"
        )
        assert reasons["pinned"] == (
            "ensemble 'pinned' depends on 'double' whose required version 4 is not loaded"
        )
        assert reasons["unwritten"] == (
            "ensemble output 'Y' for ensemble 'unwritten' is not used: no step's output_map "
            "writes it"
        )
        assert (
            reasons["loop_a"] == "circular dependency between ensembles: loop_a -> loop_b -> loop_a"
        )
        assert (
            reasons["loop_b"] == "circular dependency between ensembles: loop_b -> loop_a -> loop_b"
        )
        # an ensemble whose step is an ensemble
        response = await core.infer(pipeline.request("outer", x()), "test")
        assert np.array_equal(response.outputs[0].data, x()["X"] + 1)

    pipeline.run(scenario)
