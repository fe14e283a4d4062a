"""Triton's system shared memory extension over HTTP and gRPC, with tritonclient's own helpers
(tritonclient.utils.shared_memory), against the `simple` example model (INPUT0/INPUT1 INT32 [1,16]
-> OUTPUT0 sum, OUTPUT1 difference). Texts and codes are those Triton 2.51 gives
(docs/triton-reference-behaviour.md), 400 where Triton says 500 for a client's mistake."""

from __future__ import annotations

import base64
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from oceanus.core.errors import InferenceServerError
from oceanus.core.shared_memory import SharedMemoryManager
from tests.frontends.http.test_http_endpoints import raw

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)
SIZE = A.nbytes  # 64


class Regions:
    """Input and output regions of one test, registered under unique names; destroyed after."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:8]
        self.input_name, self.output_name = f"in_{tag}", f"out_{tag}"
        self.input_key, self.output_key = f"/oceanus_test_in_{tag}", f"/oceanus_test_out_{tag}"
        self.input = shm.create_shared_memory_region(self.input_name, self.input_key, 2 * SIZE)
        self.output = shm.create_shared_memory_region(self.output_name, self.output_key, 2 * SIZE)
        shm.set_shared_memory_region(self.input, [A, B])

    def outputs(self) -> tuple[np.ndarray, np.ndarray]:
        return (
            shm.get_contents_as_numpy(self.output, np.int32, [1, 16]),
            shm.get_contents_as_numpy(self.output, np.int32, [1, 16], offset=SIZE),
        )

    def destroy(self) -> None:
        shm.destroy_shared_memory_region(self.input)
        shm.destroy_shared_memory_region(self.output)


@pytest.fixture
def regions() -> Iterator[Regions]:
    made = Regions()
    yield made
    made.destroy()


def _http_inputs(r: Regions) -> list[httpclient.InferInput]:
    inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_shared_memory(r.input_name, SIZE)
    inputs[1].set_shared_memory(r.input_name, SIZE, offset=SIZE)
    return inputs


def _grpc_inputs(r: Regions) -> list[grpcclient.InferInput]:
    inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_shared_memory(r.input_name, SIZE)
    inputs[1].set_shared_memory(r.input_name, SIZE, offset=SIZE)
    return inputs


def _error(call: Any) -> tuple[str | None, str]:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value.status(), info.value.message()


# ---- HTTP -----------------------------------------------------------------------------------


def test_http_inputs_and_outputs_in_shared_memory(server: Any, regions: Regions) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    client.register_system_shared_memory(regions.input_name, regions.input_key, 2 * SIZE)
    client.register_system_shared_memory(regions.output_name, regions.output_key, 2 * SIZE)
    try:
        outputs = [httpclient.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
        outputs[0].set_shared_memory(regions.output_name, SIZE)
        outputs[1].set_shared_memory(regions.output_name, SIZE, offset=SIZE)
        result = client.infer("simple", _http_inputs(regions), outputs=outputs)
        # as Triton: the outputs are described, their data is in the region
        assert result.get_response()["outputs"] == [
            {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16]},
            {"name": "OUTPUT1", "datatype": "INT32", "shape": [1, 16]},
        ]
        total, difference = regions.outputs()
        np.testing.assert_array_equal(total, A + B)
        np.testing.assert_array_equal(difference, A - B)
    finally:
        client.unregister_system_shared_memory(regions.input_name)
        client.unregister_system_shared_memory(regions.output_name)


def test_http_inputs_in_shared_memory_outputs_inline(server: Any, regions: Regions) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    client.register_system_shared_memory(regions.input_name, regions.input_key, 2 * SIZE)
    try:
        for binary in (True, False):
            outputs = [
                httpclient.InferRequestedOutput(n, binary_data=binary)
                for n in ("OUTPUT0", "OUTPUT1")
            ]
            result = client.infer("simple", _http_inputs(regions), outputs=outputs)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
        # one output in the region, the other as binary data
        outputs = [httpclient.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
        client.register_system_shared_memory(regions.output_name, regions.output_key, 2 * SIZE)
        outputs[1].set_shared_memory(regions.output_name, SIZE, offset=SIZE)
        result = client.infer("simple", _http_inputs(regions), outputs=outputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
        assert result.get_output("OUTPUT1") == {
            "name": "OUTPUT1",
            "datatype": "INT32",
            "shape": [1, 16],
        }
        np.testing.assert_array_equal(regions.outputs()[1], A - B)
    finally:
        client.unregister_system_shared_memory()


def test_http_status_and_unregister(server: Any, regions: Regions) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    client.register_system_shared_memory(regions.input_name, regions.input_key, 2 * SIZE)
    client.register_system_shared_memory(regions.output_name, regions.output_key, SIZE, SIZE)
    try:
        status = client.get_system_shared_memory_status()
        assert status == [
            {"name": regions.input_name, "key": regions.input_key, "offset": 0, "byte_size": 128},
            {"name": regions.output_name, "key": regions.output_key, "offset": 64, "byte_size": 64},
        ]
        assert client.get_system_shared_memory_status(regions.input_name) == status[:1]
        client.unregister_system_shared_memory(regions.input_name)
        assert _error(lambda: client.get_system_shared_memory_status(regions.input_name)) == (
            "404",
            f"Unable to find system shared memory region: '{regions.input_name}'",
        )
        client.unregister_system_shared_memory("never_registered")  # fine, as in Triton
        client.unregister_system_shared_memory()
        assert client.get_system_shared_memory_status() == []
    finally:
        client.unregister_system_shared_memory()


def test_http_register_errors(server: Any, regions: Regions) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    name, key = regions.input_name, regions.input_key
    client.register_system_shared_memory(name, key, 2 * SIZE)
    try:
        assert _error(lambda: client.register_system_shared_memory(name, key, SIZE)) == (
            "400",
            f"shared memory region '{name}' already in manager",
        )
        assert _error(lambda: client.register_system_shared_memory("r", key + "_gone", SIZE)) == (
            "400",
            f"Unable to open shared memory region: '{key}_gone'",
        )
        assert _error(lambda: client.register_system_shared_memory("r", key, SIZE, SIZE + 1)) == (
            "400",
            "failed to register shared memory region 'r': invalid args",
        )
        register = f"/v2/systemsharedmemory/region/{name}x/register"
        for body, message in (
            ({"byte_size": 64}, "Shared memory register request has no 'key' field"),
            ({"key": key}, "Shared memory register request has no 'byte_size' field"),
            ({"key": 5, "byte_size": 64}, "attempt to access JSON non-string as string"),
            (
                {"key": key, "offset": -1, "byte_size": 64},
                "attempt to access JSON non-unsigned-integer as unsigned-integer",
            ),
        ):
            status, _, answer = raw(server, "POST", register, orjson.dumps(body))
            assert (status, orjson.loads(answer)) == (400, {"error": message})
        status, _, answer = raw(server, "POST", "/v2/systemsharedmemory/register", b"{}")
        assert (status, orjson.loads(answer)["error"]) == (
            400,
            "'region name' is necessary to register system shared memory region",
        )
        assert raw(server, "GET", register)[0] == 405
        assert raw(server, "POST", "/v2/systemsharedmemory/status")[0] == 405
        assert raw(server, "GET", "/v2/systemsharedmemory/region/x/bogus")[0] == 404
    finally:
        client.unregister_system_shared_memory(name)


def test_http_infer_errors(server: Any, regions: Regions) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    client.register_system_shared_memory(regions.input_name, regions.input_key, 2 * SIZE)
    client.register_system_shared_memory(regions.output_name, regions.output_key, 2 * SIZE)
    region = regions.input_name

    def infer(offset: int = SIZE, size: int = SIZE, name: str = region, outputs: Any = None) -> Any:
        inputs = _http_inputs(regions)
        inputs[1].set_shared_memory(name, size, offset=offset)
        return lambda: client.infer("simple", inputs, outputs=outputs)

    try:
        assert _error(infer(name="nope")) == ("404", "Unable to find shared memory region: 'nope'")
        assert _error(infer(offset=2 * SIZE)) == (
            "400",
            f"Invalid offset for shared memory region: '{region}'",
        )
        assert _error(infer(offset=SIZE + 4)) == (
            "400",
            f"Invalid offset + byte size for shared memory region: '{region}'",
        )
        assert _error(infer(size=SIZE // 2)) == (
            "400",
            "[request id: <id_unknown>] input byte size mismatch for input 'INPUT1' for model "
            "'simple'. Expected 64, got 32",
        )
        small = httpclient.InferRequestedOutput("OUTPUT0")
        small.set_shared_memory(regions.output_name, SIZE // 2)
        assert _error(infer(outputs=[small])) == (
            "400",
            "shared memory size specified with the request for output 'OUTPUT0' (32 bytes) "
            "should be at least 64 bytes to hold the results",
        )
        # shared memory and data at once
        document = {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "INT32",
                    "shape": [1, 16],
                    "data": list(range(16)),
                    "parameters": {"shared_memory_region": region, "shared_memory_byte_size": 64},
                }
            ]
        }
        status, _, answer = raw(server, "POST", "/v2/models/simple/infer", orjson.dumps(document))
        assert (status, orjson.loads(answer)["error"]) == (
            400,
            "Input must set only one of the following fields: 'data', 'binary_data_size' in "
            "'parameters', 'shared_memory_region' in 'parameters'. But set 'data' "
            "'shared_memory_region'",
        )
        binary = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
        binary.set_shared_memory(regions.output_name, SIZE)
        binary._parameters["binary_data"] = True  # tritonclient drops it; a raw client may not
        assert _error(infer(outputs=[binary])) == (
            "400",
            "Output can't set both 'shared_memory_region' and 'binary_data'",
        )
    finally:
        client.unregister_system_shared_memory()


def test_http_cuda_shared_memory_is_unavailable(server: Any) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.get_cuda_shared_memory_status() == []
    assert _error(lambda: client.get_cuda_shared_memory_status("x")) == (
        "404",
        "Unable to find cuda shared memory region: 'x'",
    )
    handle = base64.b64encode(bytes(64)).decode()  # a cudaIpcMemHandle_t is 64 bytes
    body: dict[str, Any] = {"raw_handle": {"b64": handle}, "device_id": 0, "byte_size": 64}
    status, _, answer = raw(
        server, "POST", "/v2/cudasharedmemory/region/x/register", orjson.dumps(body)
    )
    assert (status, orjson.loads(answer)) == (
        400,
        {"error": "failed to register shared memory region: invalid args"},
    )
    body["raw_handle"] = {"b64": "aGFuZGxl"}
    status, _, answer = raw(
        server, "POST", "/v2/cudasharedmemory/region/x/register", orjson.dumps(body)
    )
    assert orjson.loads(answer)["error"] == (
        "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"
    )
    client.unregister_cuda_shared_memory()


# ---- gRPC -----------------------------------------------------------------------------------


def test_grpc_inputs_and_outputs_in_shared_memory(server: Any, regions: Regions) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.register_system_shared_memory(regions.input_name, regions.input_key, 2 * SIZE)
    client.register_system_shared_memory(regions.output_name, regions.output_key, 2 * SIZE)
    try:
        status = client.get_system_shared_memory_status(as_json=True)["regions"]
        assert status[regions.input_name] == {
            "name": regions.input_name,
            "key": regions.input_key,
            "byte_size": "128",
        }
        outputs = [grpcclient.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
        outputs[0].set_shared_memory(regions.output_name, SIZE)
        outputs[1].set_shared_memory(regions.output_name, SIZE, offset=SIZE)
        result = client.infer("simple", _grpc_inputs(regions), outputs=outputs)
        response = result.get_response()
        assert [o.name for o in response.outputs] == ["OUTPUT0", "OUTPUT1"]
        assert list(response.raw_output_contents) == [b"", b""]  # as Triton sends them
        total, difference = regions.outputs()
        np.testing.assert_array_equal(total, A + B)
        np.testing.assert_array_equal(difference, A - B)
        # inputs in shared memory, outputs inline
        result = client.infer("simple", _grpc_inputs(regions))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
        # one input in shared memory, the other in raw_input_contents
        inputs = _grpc_inputs(regions)
        inputs[0] = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
        inputs[0].set_data_from_numpy(A * 2)
        result = client.infer("simple", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A * 2 + B)
        client.unregister_system_shared_memory(regions.input_name)
        assert list(client.get_system_shared_memory_status().regions) == [regions.output_name]
    finally:
        client.unregister_system_shared_memory()
    assert len(client.get_system_shared_memory_status().regions) == 0


def test_grpc_errors(server: Any, regions: Regions) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    name, key = regions.input_name, regions.input_key
    client.register_system_shared_memory(name, key, 2 * SIZE)
    client.register_system_shared_memory(regions.output_name, regions.output_key, 2 * SIZE)
    try:
        assert _error(lambda: client.register_system_shared_memory(name, key, SIZE)) == (
            "StatusCode.ALREADY_EXISTS",
            f"shared memory region '{name}' already in manager",
        )
        assert _error(lambda: client.register_system_shared_memory("r", key + "_gone", SIZE)) == (
            "StatusCode.INVALID_ARGUMENT",
            f"Unable to open shared memory region: '{key}_gone'",
        )

        def infer(offset: int = SIZE, size: int = SIZE, region: str = name, outputs: Any = None):
            inputs = _grpc_inputs(regions)
            inputs[1].set_shared_memory(region, size, offset=offset)
            return lambda: client.infer("simple", inputs, outputs=outputs)

        assert _error(infer(region="nope")) == (
            "StatusCode.NOT_FOUND",
            "Unable to find shared memory region: 'nope'",
        )
        assert _error(infer(offset=SIZE + 4)) == (
            "StatusCode.INVALID_ARGUMENT",
            f"Invalid offset + byte size for shared memory region: '{name}'",
        )
        assert _error(infer(size=SIZE // 2)) == (
            "StatusCode.INVALID_ARGUMENT",
            "[request id: <id_unknown>] input byte size mismatch for input 'INPUT1' for model "
            "'simple'. Expected 64, got 32",
        )
        small = grpcclient.InferRequestedOutput("OUTPUT1")
        small.set_shared_memory(regions.output_name, SIZE // 2)
        assert _error(infer(outputs=[small])) == (
            "StatusCode.INVALID_ARGUMENT",
            "shared memory size specified with the request for output 'OUTPUT1' (32 bytes) "
            "should be at least 64 bytes to hold the results",
        )
    finally:
        client.unregister_system_shared_memory()


# ---- a region in use --------------------------------------------------------------------------


def test_unregister_refuses_a_region_in_use(
    model_repository: Path, launch: Any, regions: Regions
) -> None:
    """TRITONSERVER_DELAY_SCHEDULER=2 holds the first request in simple_dyna's queue until a
    second one comes: meanwhile its regions are in use, as Triton keeps them."""
    server = launch([model_repository], env={"TRITONSERVER_DELAY_SCHEDULER": "2"})
    client = httpclient.InferenceServerClient(server.http_url, concurrency=2)
    client.register_system_shared_memory(regions.input_name, regions.input_key, 2 * SIZE)
    client.register_system_shared_memory(regions.output_name, regions.output_key, 2 * SIZE)
    output = httpclient.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory(regions.output_name, SIZE)
    pending = client.async_infer("simple_dyna", _http_inputs(regions), outputs=[output])
    deadline = time.monotonic() + 10
    while True:  # until the request is queued
        try:
            client.unregister_system_shared_memory(regions.input_name)
        except InferenceServerException as exc:
            assert (exc.status(), exc.message()) == (
                "400",
                f"Cannot unregister shared memory region '{regions.input_name}', it is currently "
                "in use.",
            )
            break
        client.register_system_shared_memory(regions.input_name, regions.input_key, 2 * SIZE)
        assert time.monotonic() < deadline, "the request never queued"
    assert _error(lambda: client.unregister_system_shared_memory()) == (
        "400",
        "Failed to unregister the following system shared memory regions: "
        f"{regions.input_name} ,{regions.output_name} ,",
    )
    second = client.async_infer("simple_dyna", _http_inputs(regions))  # releases the batch
    pending.get_result()
    np.testing.assert_array_equal(second.get_result().as_numpy("OUTPUT1"), A - B)
    np.testing.assert_array_equal(regions.outputs()[0], A + B)
    client.unregister_system_shared_memory()
    assert client.get_system_shared_memory_status() == []


# ---- the core's manager ---------------------------------------------------------------------


@pytest.fixture
def segment() -> Iterator[tuple[str, Any]]:
    key = f"/oceanus_test_core_{uuid.uuid4().hex[:8]}"
    region = shm.create_shared_memory_region("core", key, 3 * 4096)
    yield key, region
    shm.destroy_shared_memory_region(region)


def test_manager_maps_windows_at_any_offset(segment: tuple[str, Any]) -> None:
    key, handle = segment
    data = np.arange(1000, dtype=np.int32)
    shm.set_shared_memory_region(handle, [data], offset=4100)
    manager = SharedMemoryManager()
    manager.register("r", key, 4100, 4000)  # not page-aligned: Oceanus maps the page around it
    uses: list[Any] = []
    view = manager.input_view("r", 40, 16, uses)
    assert view.readonly
    np.testing.assert_array_equal(np.frombuffer(view, np.int32), data[10:14])
    target = manager.output_target("r", 0, 8, uses)
    target.view[:] = np.array([7, 8], np.int32).tobytes()
    np.testing.assert_array_equal(
        shm.get_contents_as_numpy(handle, np.int32, [2], offset=4100), [7, 8]
    )
    assert len(uses) == 2
    del view, target
    manager.unregister("r")
    assert manager.status() == []
    with pytest.raises(InferenceServerError, match="Unable to find shared memory region: 'r'"):
        manager.input_view("r", 0, 4, [])


def test_manager_never_unlinks_the_client_object(segment: tuple[str, Any]) -> None:
    key, _ = segment
    manager = SharedMemoryManager()
    manager.register("a", key, 0, 64)
    manager.register("b", key, 64, 64)  # one object, two regions (Triton 2.51 mishandles this)
    view = manager.input_view("a", 0, 64, [])  # a live view: unmapped once it goes away
    manager.unregister("a")
    manager.close()
    assert manager.status() == []
    assert len(view) == 64
    del view
    assert os.path.exists("/dev/shm" + key)
    with pytest.raises(InferenceServerError, match="failed to register shared memory region 'z'"):
        manager.register("z", key, 0, 0)


def test_many_concurrent_requests_share_a_region(server: Any, regions: Regions) -> None:
    client = httpclient.InferenceServerClient(server.http_url, concurrency=8)
    client.register_system_shared_memory(regions.input_name, regions.input_key, 2 * SIZE)
    try:
        results = [client.async_infer("simple", _http_inputs(regions)) for _ in range(32)]
        for result in results:
            np.testing.assert_array_equal(result.get_result().as_numpy("OUTPUT0"), A + B)
        # every request is done: the region is no longer in use
        client.unregister_system_shared_memory(regions.input_name)
    finally:
        client.unregister_system_shared_memory()
