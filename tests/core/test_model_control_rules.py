"""Model control (core/repository/manager.py), in process over fake-backend models: explicit load
and unload, loads with a config override and files, reloads that fail no request, unloads that wait
for the requests in flight, and poll mode following the repository. The repository API on the
wire is tests/wire/test_model_control.py (HTTP) and tests/frontends/grpc/
test_grpc_model_control.py (gRPC)."""

from __future__ import annotations

import asyncio
import json

import pytest

from oceanus.core.errors import ErrorCode, InferenceServerError
from oceanus.core.server import ServerCore
from oceanus.core.types import InferResponse
from tests.core.fakes import IO_FP32, World, outcome, rows, until

OVERRIDE = {
    "name": "m",
    "backend": "fake",
    "max_batch_size": 4,
    "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [4]}],
    "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]}],
}


def index(core: ServerCore) -> dict[str, list[dict[str, str]]]:
    by_name: dict[str, list[dict[str, str]]] = {}
    for entry in core.repository_index():
        by_name.setdefault(entry["name"], []).append(entry)
    return by_name


def test_explicit_mode_loads_and_unloads_on_request(world: World) -> None:
    world.add("a", IO_FP32, max_batch_size=8)
    world.add("b", IO_FP32, max_batch_size=8)

    async def scenario(core: ServerCore) -> None:
        assert index(core) == {
            "a": [{"name": "a", "version": "1", "state": "READY"}],
            "b": [{"name": "b"}],  # never loaded
        }
        assert not core.model_ready("b")
        await core.load_model("b")
        assert core.model_ready("b")
        await core.unload_model("a")
        assert index(core)["a"] == [
            {"name": "a", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
        ]
        assert not core.model_ready("a")
        with pytest.raises(InferenceServerError) as caught:
            await core.load_model("nonexistent")
        assert caught.value.message == (
            "failed to load 'nonexistent', failed to poll from model repository"
        )
        await core.unload_model("nonexistent")  # a no-op success, as in Triton 2.51
        assert "nonexistent" not in index(core)
        await core.load_model("a")
        assert core.model_ready("a") and world.model("a").loads == 2

    world.run(scenario, control_mode="explicit", startup_models=["a"])


def test_loads_with_a_config_override_and_files(world: World) -> None:
    world.add("m", IO_FP32, max_batch_size=8)

    async def scenario(core: ServerCore) -> None:
        await core.load_model("m", json.dumps(OVERRIDE))
        assert core.model_config("m").max_batch_size == 4
        # a model made only of supplied files, under a name the repository does not have
        uploaded = json.dumps({**OVERRIDE, "name": "uploaded"})
        await core.load_model("uploaded", uploaded, {"1/model.fake": b"fake"})
        response = await core.infer(world.request("uploaded", rows(2)), "test")
        assert response.outputs[0].shape == (2, 4)
        for name, config, files, message in (
            ("other", None, {"1/model.fake": b""}, "require the 'config' parameter"),
            ("bad", "{", None, "failed to load 'bad': failed to parse 'config'"),
            ("esc", uploaded.replace("uploaded", "esc"), {"../x": b""}, "leaves the model"),
        ):
            with pytest.raises(InferenceServerError) as caught:
                await core.load_model(name, config, files)
            assert message in caught.value.message
        with pytest.raises(InferenceServerError) as caught:
            await core.load_model("..")
        assert "invalid model name" in caught.value.message

    world.run(scenario, control_mode="explicit")


def test_a_reload_fails_no_request(world: World) -> None:
    """A reload builds new instances beside the old; requests move to them once they are
    ready, and the old version unloads after its queued and running requests finish."""
    world.add("m", IO_FP32 + "dynamic_batching { }", max_batch_size=1)
    model = world.model("m")

    async def scenario(core: ServerCore) -> None:
        old = core.resolve("m")
        model.hold()
        running = core.infer(world.request("m", rows(1, 0)), "test")
        await model.wait_executions(1)
        queued = core.infer(world.request("m", rows(1, 1)), "test")
        reload = asyncio.ensure_future(core.load_model("m"))
        await until(lambda: core.resolve("m") is not old)  # the new version is ready
        new = core.resolve("m")
        served_by_new = core.infer(world.request("m", rows(1, 2)), "test")
        await model.wait_executions(2)  # the new version's instance runs it meanwhile
        assert not reload.done()  # the old version still has requests
        model.release_all()
        for future in (running, queued, served_by_new):
            assert isinstance(await outcome(future), InferResponse)
        await reload
        assert not old.ready and new.ready and model.loads == 2
        assert [e.inputs["IN"][0, 0] for e in model.executed] == [0, 2, 1]

    world.run(scenario, control_mode="explicit", startup_models=["m"])


def test_an_unload_waits_for_the_requests_in_flight(world: World) -> None:
    world.add("m", IO_FP32, max_batch_size=8)
    model = world.model("m")
    model.hold()

    async def scenario(core: ServerCore) -> None:
        futures = [core.infer(world.request("m", rows(1, i)), "test") for i in range(3)]
        await model.wait_executions(1)
        unload = asyncio.ensure_future(core.unload_model("m"))
        await until(lambda: not core.model_serving("m"))  # the version is unloading
        with pytest.raises(InferenceServerError, match="has no available versions"):
            core.infer(world.request("m", rows()), "test")  # no new requests meanwhile
        assert not unload.done()
        model.release_all()
        await unload
        for future in futures:
            assert isinstance(await outcome(future), InferResponse)
        with pytest.raises(InferenceServerError) as caught:
            core.model_metadata("m")
        assert caught.value.message == "Request for unknown model: 'm' has no available versions"

    world.run(scenario, control_mode="explicit", startup_models=["m"])


def test_poll_mode_follows_the_repository(world: World) -> None:
    world.add("kept", IO_FP32, max_batch_size=8)
    world.add("removed", IO_FP32, max_batch_size=8)

    async def scenario(core: ServerCore) -> None:
        with pytest.raises(InferenceServerError) as caught:
            await core.load_model("kept")
        assert (caught.value.code, caught.value.message) == (
            ErrorCode.UNAVAILABLE,
            "explicit model load / unload is not allowed if polling is enabled",
        )
        poll = core.manager.poll_once
        world.add("added", IO_FP32, max_batch_size=8)
        (world.repository / "removed" / "config.pbtxt").unlink()
        for path in sorted((world.repository / "removed").rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        (world.repository / "removed").rmdir()
        await poll()
        assert core.model_ready("added")
        assert index(core)["removed"][0]["state"] == "UNAVAILABLE"

        config = world.repository / "kept" / "config.pbtxt"
        config.write_text(config.read_text().replace("max_batch_size: 8", "max_batch_size: 4"))
        await poll()
        assert core.model_config("kept").max_batch_size == 4
        assert world.model("kept").loads == 2
        await poll()  # nothing changed: nothing reloads
        assert world.model("kept").loads == 2
        config.write_text("name: broken {")
        await poll()  # a broken edit keeps the loaded version serving
        assert core.model_ready("kept")
        assert isinstance(await core.infer(world.request("kept", rows()), "test"), InferResponse)

    world.run(scenario, control_mode="poll", poll_seconds=3600)
