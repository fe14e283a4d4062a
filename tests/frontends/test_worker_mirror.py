"""Validation in the frontend workers (frontends/workers/mirror.py, issue 27), in process: a
worker's mirror marks a request with the serial of the version it validated it against, the core
skips its checks only for that very version (a reload's new version checks again, and refuses
with its own words), and the arrays and rows the core takes from a marked request are the ones
validate_request gives. The wire (errors through workers keep Triton's words) is every wire test
run with --frontend-workers 2 (scripts/test.sh). For a version that uses the response cache the
mirror also hashes the request: its key is the core's, across the wire's encoding, and the core
uses it only for the version it was made for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from oceanus.core import datatypes
from oceanus.core.errors import InferenceServerError
from oceanus.core.response_cache import request_key
from oceanus.core.server import ServerCore
from oceanus.core.types import InferRequest, InferResponse, RequestedOutput, Tensor
from oceanus.core.validation import TensorSpec, checked_inputs, validate_request
from oceanus.frontends.workers.messages import decode_request, encode_request
from oceanus.frontends.workers.mirror import Mirror, Specs
from tests.core.fakes import IO_FP32, World, outcome, rows

THREE_WIDE = {
    "name": "m",
    "backend": "fake",
    "max_batch_size": 8,
    "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [3]}],
    "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [3]}],
}


async def _answer(core: ServerCore, request: InferRequest) -> Any:
    """The response, or the error the core refused or failed the request with."""
    try:
        future = core.infer(request, "test")
    except InferenceServerError as exc:  # refused before it was queued
        return exc
    return await outcome(future)


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def test_the_core_skips_the_checks_only_for_the_version_the_worker_checked(world: World) -> None:
    world.add("m", IO_FP32, max_batch_size=8)

    async def scenario(core: ServerCore) -> None:
        mirror, specs = Mirror(), Specs(core)
        mirror.update(specs())
        serial = core.resolve("m").serial
        good = world.request("m", rows(2))
        assert mirror.check(good) == (serial, b"")
        assert mirror.check(world.request("m", rows(2), model_version="1"))[0] == serial
        # refused or unknown here: unmarked, the core words the error
        assert mirror.check(world.request("m", rows(2, width=3))) == (0, b"")
        assert mirror.check(world.request("m", rows(9))) == (0, b"")
        assert mirror.check(world.request("m", rows(2), model_version="2")) == (0, b"")
        assert mirror.check(world.request("other", rows(2))) == (0, b"")
        good.checked = serial
        answered = await _answer(core, good)
        assert isinstance(answered, InferResponse) and answered.outputs[0].shape == (2, 4)

        # A reload the worker has not heard of: what the stale mirror passes, the new version
        # (another serial) checks and refuses exactly as an unmarked request.
        await core.load_model("m", json.dumps(THREE_WIDE))
        assert core.resolve("m").serial != serial
        stale = world.request("m", rows(2))
        stale.checked = mirror.check(stale)[0]
        assert stale.checked == serial
        refused = await _answer(core, stale)
        unmarked = await _answer(core, world.request("m", rows(2)))
        assert isinstance(refused, InferenceServerError)
        assert isinstance(unmarked, InferenceServerError)
        assert (refused.code, refused.message) == (unmarked.code, unmarked.message)
        assert "unexpected shape for input 'IN'" in refused.message

        mirror.update(specs())  # the reload started a version: specs made again
        assert mirror.check(world.request("m", rows(2, width=3)))[0] == core.resolve("m").serial
        assert mirror.check(world.request("m", rows(2))) == (0, b"")

    world.run(scenario, control_mode="explicit", startup_models=["m"])


CACHED_IO = """
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "TEXT" data_type: TYPE_STRING dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]
response_cache { enable: true }
"""


def _cached_request(world: World, offset: int, **fields: Any) -> InferRequest:
    inputs = {
        "INPUT0": np.arange(16, dtype=np.int32).reshape(1, 16) + offset,
        "TEXT": np.array([[b"a", "\u00e9".encode()]], dtype=object),
    }
    return world.request("c", inputs, **fields)


def test_the_workers_cache_key_is_the_cores_and_is_trusted_only_for_its_version(
    world: World,
) -> None:
    world.add("c", CACHED_IO, max_batch_size=8)
    world.add("m", IO_FP32, max_batch_size=8)

    async def scenario(core: ServerCore) -> None:
        mirror = Mirror()
        mirror.update(Specs(core)())
        version = core.resolve("c")
        for fields in (
            {},
            {"outputs": [RequestedOutput("OUTPUT0")]},
            {"parameters": {"flag": True, "n": 3, "x": 0.5, "s": "t", "priority": 1}},
        ):
            request = _cached_request(world, 1, **fields)
            serial, key = mirror.check(request)
            # what the core receives: the request through the link's encoding
            arrived = decode_request(encode_request(request), None)
            assert serial == version.serial
            assert key == request_key("c", version.version_str, arrived)
        assert mirror.check(world.request("m", rows(2)))[1] == b""  # caches nothing

        def marked(offset: int, key: bytes, serial: int) -> InferRequest:
            request = _cached_request(world, offset)
            request.checked, request.cache_key = serial, key
            return request

        async def hits() -> int:
            return int(core.statistics("c")[0]["inference_stats"]["cache_hit"]["count"])

        # the worker's key with its serial is used as it is: a wrong one stores under it
        await core.infer(marked(5, b"not the real key", version.serial), "test")
        await core.infer(_cached_request(world, 5), "test")
        assert await hits() == 0
        await core.infer(marked(5, b"not the real key", version.serial), "test")
        assert await hits() == 1
        # with another serial (a stale mirror) the core hashes the request itself
        await core.infer(marked(5, b"not the real key", version.serial + 1000), "test")
        assert await hits() == 2  # the unmarked request's entry, under the real key

    world.run(scenario, response_cache_size=1 << 20)


def _spec(name: str, datatype: str, dims: tuple[int, ...]) -> TensorSpec:
    return TensorSpec(name, datatypes.BY_NAME[datatype], dims)


@pytest.mark.parametrize(
    ("max_batch_size", "inputs"),
    [
        (8, [("A", "INT32", (2, 4), np.arange(8, dtype=np.int32))]),  # flat: reshaped
        (8, [("A", "INT32", (1, 4), np.ones((1, 4), np.int32)), ("B", "FP32", (1, 2), None)]),
        (0, [("A", "INT32", (3,), np.arange(3, dtype=np.int32))]),  # no batch dimension
        (4, [("A", "BYTES", (2, 1), np.array([b"x", b"yz"], dtype=object))]),
        (8, [("A", "INT32", [2, 2], np.arange(4, dtype=np.int32))]),  # a list shape (JSON)
    ],
)
def test_a_checked_request_gives_the_arrays_and_rows_validation_gives(
    max_batch_size: int, inputs: list[tuple[str, str, Any, np.ndarray | None]]
) -> None:
    tensors, specs = [], {}
    for name, datatype, shape, data in inputs:
        if data is None:
            data = np.zeros(shape, datatypes.BY_NAME[datatype].dtype)
        tensors.append(Tensor(name, datatype, shape, data))
        dims = tuple(shape[1:] if max_batch_size else shape)
        specs[name] = _spec(name, datatype, dims)
    request = InferRequest("m", inputs=tensors)
    arrays, batch = validate_request(request, "m", max_batch_size, specs, {})
    checked, checked_batch = checked_inputs(request, max_batch_size)
    assert checked_batch == batch
    assert list(checked) == list(arrays)
    for name, array in arrays.items():
        assert checked[name].shape == array.shape
        assert checked[name].tolist() == array.tolist()
