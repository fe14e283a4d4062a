"""ModelInfer over gRPC: every datatype raw and typed, parameters, large tensors, cancellation."""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
from typing import Any

import grpc
import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from grpc_testlib import grpc_error, unary
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

NUMERIC = {
    "BOOL": np.bool_,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BF16": ml_dtypes.bfloat16,
}

# datatype -> InferTensorContents field that carries it
TYPED_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def sample(datatype: str) -> np.ndarray:
    rng = np.random.default_rng(11)
    if datatype == "BYTES":
        return np.array([[b"hello", b"w\x00rld", "\u00e9t\u00e9".encode(), b""]], dtype=object)
    if datatype == "BOOL":
        return rng.integers(0, 2, size=(2, 5)).astype(np.bool_)
    dtype = np.dtype(NUMERIC[datatype])
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.array([[info.min, info.max, 0, 1, 7], [3, 4, 5, 6, info.max - 1]], dtype=dtype)
    return (rng.standard_normal((2, 5)) * 100).astype(dtype)


def one_input(name: str, data: np.ndarray, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(data.shape), datatype)
    tensor.set_data_from_numpy(data)
    return tensor


def simple_inputs(a: np.ndarray, b: np.ndarray) -> list[grpcclient.InferInput]:
    return [one_input("INPUT0", a, "INT32"), one_input("INPUT1", b, "INT32")]


@pytest.mark.parametrize("datatype", [*NUMERIC, "BYTES"])
def test_every_datatype_round_trips_raw(
    grpc_client: grpcclient.InferenceServerClient, datatype: str
) -> None:
    data = sample(datatype)
    result = grpc_client.infer(
        f"identity_{datatype.lower()}", [one_input("INPUT0", data, datatype)]
    )
    output = result.as_numpy("OUTPUT0")
    assert output.shape == data.shape
    if datatype == "BF16":
        assert output.dtype == np.dtype(ml_dtypes.bfloat16)
    assert np.array_equal(output, data)
    response = result.get_response()
    assert response.outputs[0].datatype == datatype
    assert len(response.raw_output_contents) == 1


@pytest.mark.parametrize("datatype", list(TYPED_FIELD))
def test_every_typed_contents_field_round_trips(grpc_channel: grpc.Channel, datatype: str) -> None:
    data = sample(datatype)
    request = pb.ModelInferRequest(model_name=f"identity_{datatype.lower()}", id="typed")
    tensor = request.inputs.add(name="INPUT0", datatype=datatype, shape=list(data.shape))
    getattr(tensor.contents, TYPED_FIELD[datatype]).extend(data.reshape(-1).tolist())
    response = unary(grpc_channel, "ModelInfer", request, pb.ModelInferResponse)
    assert response.id == "typed"
    assert len(response.raw_output_contents) == 1 and not response.outputs[0].HasField("contents")
    output = response.outputs[0]
    assert list(output.shape) == list(data.shape)
    raw = response.raw_output_contents[0]
    if datatype == "BYTES":
        from tritonclient.utils import deserialize_bytes_tensor

        assert list(deserialize_bytes_tensor(raw)) == list(data.reshape(-1))
    else:
        assert np.array_equal(np.frombuffer(raw, NUMERIC[datatype]).reshape(data.shape), data)


def test_half_precision_has_no_typed_field(grpc_channel: grpc.Channel) -> None:
    request = pb.ModelInferRequest(model_name="identity_fp16")
    tensor = request.inputs.add(name="INPUT0", datatype="FP16", shape=[1, 2])
    tensor.contents.fp32_contents.extend([1.0, 2.0])
    with pytest.raises(grpc.RpcError) as info:
        unary(grpc_channel, "ModelInfer", request, pb.ModelInferResponse)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        "unexpected explicit tensor data for input tensor 'INPUT0' for model 'identity_fp16' "
        "of type 'FP32', expected datatype 'FP16'"
    )


def test_raw_and_typed_together_are_refused(grpc_channel: grpc.Channel) -> None:
    request = pb.ModelInferRequest(model_name="identity_fp32")
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 2])
    tensor.contents.fp32_contents.extend([1.0, 2.0])
    request.raw_input_contents.append(np.ones(2, np.float32).tobytes())
    with pytest.raises(grpc.RpcError) as info:
        unary(grpc_channel, "ModelInfer", request, pb.ModelInferResponse)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        "contents field must not be specified when using raw_input_contents for 'INPUT0' for "
        "model 'identity_fp32'"
    )


def test_missing_input_data(grpc_channel: grpc.Channel) -> None:
    request = pb.ModelInferRequest(model_name="identity_fp32")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 2])
    with pytest.raises(grpc.RpcError) as info:
        unary(grpc_channel, "ModelInfer", request, pb.ModelInferResponse)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        "unable to find data for input tensor 'INPUT0' for model 'identity_fp32' in request."
    )


def test_simple_outputs_ids_and_requested_outputs(
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    result = grpc_client.infer("simple", simple_inputs(a, b), request_id="r-1")
    assert np.array_equal(result.as_numpy("OUTPUT0"), a + b)
    assert np.array_equal(result.as_numpy("OUTPUT1"), a - b)
    response = result.get_response()
    assert (response.model_name, response.model_version, response.id) == ("simple", "1", "r-1")
    assert [o.name for o in response.outputs] == ["OUTPUT0", "OUTPUT1"]
    # only the requested output, in the requested order
    result = grpc_client.infer(
        "simple", simple_inputs(a, b), outputs=[grpcclient.InferRequestedOutput("OUTPUT1")]
    )
    response = result.get_response()
    assert [o.name for o in response.outputs] == ["OUTPUT1"]
    assert len(response.raw_output_contents) == 1
    assert np.array_equal(result.as_numpy("OUTPUT1"), a - b)
    # a batch of 4 rows
    a4 = np.arange(64, dtype=np.int32).reshape(4, 16)
    result = grpc_client.infer("simple", simple_inputs(a4, a4), model_version="1")
    assert np.array_equal(result.as_numpy("OUTPUT0"), a4 * 2)


def test_parameters(grpc_client: grpcclient.InferenceServerClient) -> None:
    data = np.ones((1, 4), np.float32)
    inputs = [one_input("INPUT0", data, "FP32")]
    # custom parameters and the scheduling ones are accepted
    result = grpc_client.infer(
        "identity_fp32",
        inputs,
        parameters={"custom": "x", "count": 3, "flag": True},
        priority=1,
        timeout=1_000_000,
    )
    assert np.array_equal(result.as_numpy("OUTPUT0"), data)


def test_reserved_parameter_keys(grpc_channel: grpc.Channel) -> None:
    """(tritonclient refuses these itself, so the request is built by hand.)"""
    request = pb.ModelInferRequest(model_name="identity_fp32")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 1])
    request.raw_input_contents.append(np.ones(1, np.float32).tobytes())
    request.parameters["triton_secret"].int64_param = 1
    with pytest.raises(grpc.RpcError) as info:
        unary(grpc_channel, "ModelInfer", request, pb.ModelInferResponse)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        "parameter keys starting with 'triton_' are reserved for Triton usage. Only the "
        "following keys starting with 'triton_' are allowed: triton_enable_empty_final_response"
    )


def test_parameter_types_are_checked(grpc_channel: grpc.Channel) -> None:
    request = pb.ModelInferRequest(model_name="identity_fp32")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 1])
    request.raw_input_contents.append(np.ones(1, np.float32).tobytes())
    request.parameters["priority"].string_param = "high"
    with pytest.raises(grpc.RpcError) as info:
        unary(grpc_channel, "ModelInfer", request, pb.ModelInferResponse)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        "invalid value type for 'priority' parameter, expected int64_param or uint64_param."
    )


def test_shared_memory_inputs_name_no_region(grpc_channel: grpc.Channel) -> None:
    request = pb.ModelInferRequest(model_name="identity_fp32")
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    tensor.parameters["shared_memory_region"].string_param = "input_region"
    tensor.parameters["shared_memory_byte_size"].int64_param = 16
    with pytest.raises(grpc.RpcError) as info:
        unary(grpc_channel, "ModelInfer", request, pb.ModelInferResponse)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert info.value.details() == "Unable to find shared memory region: 'input_region'"


def test_large_tensors_both_ways(grpc_client: grpcclient.InferenceServerClient) -> None:
    """12 MiB each way: far past grpcio's 4 MiB default receive limit."""
    data = np.random.default_rng(3).standard_normal((1, 3 * 1024 * 1024)).astype(np.float32)
    result = grpc_client.infer("identity_fp32", [one_input("INPUT0", data, "FP32")])
    assert np.array_equal(result.as_numpy("OUTPUT0"), data)
    strings = np.array([[b"x" * 1_000_000] * 6], dtype=object)
    result = grpc_client.infer("identity_bytes", [one_input("INPUT0", strings, "BYTES")])
    assert list(result.as_numpy("OUTPUT0").reshape(-1)) == list(strings.reshape(-1))


def test_unknown_model_and_bad_inputs(grpc_client: grpcclient.InferenceServerClient) -> None:
    data = np.ones((1, 16), np.int32)
    status, message = grpc_error(
        lambda: grpc_client.infer("no_such_model", simple_inputs(data, data))
    )
    assert status == "NOT_FOUND"
    assert "no_such_model" in message
    status, message = grpc_error(
        lambda: grpc_client.infer("simple", [one_input("INPUT0", data, "INT32")], request_id="q")
    )
    assert status == "INVALID_ARGUMENT"
    assert message.startswith("[request id: q] expected 2 inputs but got 1 inputs")
    status, message = grpc_error(
        lambda: grpc_client.infer("simple", simple_inputs(data, data), model_version="9")
    )
    assert status == "NOT_FOUND"


def test_aio_client_concurrent_requests(server: Any) -> None:
    async def main() -> None:
        client = aioclient.InferenceServerClient(server.grpc_url)
        try:
            assert await client.is_server_ready()
            assert (await client.get_model_metadata("simple")).name == "simple"

            async def one(i: int) -> None:
                a = np.full((1, 16), i, np.int32)
                result = await client.infer("simple", simple_inputs(a, a), request_id=str(i))
                assert result.get_response().id == str(i)
                assert np.array_equal(result.as_numpy("OUTPUT0"), a * 2)

            await asyncio.gather(*(one(i) for i in range(40)))
            with pytest.raises(InferenceServerException) as info:
                await client.infer("no_such_model", [])
            assert "StatusCode.NOT_FOUND" in str(info.value.status())
        finally:
            await client.close()

    asyncio.run(main())


def _slow_counts(client: grpcclient.InferenceServerClient) -> tuple[int, int, int]:
    stats = client.get_inference_statistics("slow_fp32").model_stats[0]
    return (
        stats.inference_stats.success.count,
        stats.inference_stats.fail.count,
        stats.execution_count,
    )


def _pending(server: Any) -> int:
    """slow_fp32's nv_inference_pending_request_count (queued plus executing requests)."""
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    found = re.search(
        r'^nv_inference_pending_request_count\{[^}]*model="slow_fp32"[^}]*\} (\S+)$', text, re.M
    )
    return int(float(found.group(1))) if found else 0


def wait_for_accounting(
    client: grpcclient.InferenceServerClient, before: tuple[int, int, int], total: int
) -> tuple[int, int, int]:
    """slow_fp32's (successes, failures, executions) since `before`, once `total` requests are
    accounted for or the numbers stop moving (a request cancelled before the server saw it is
    never counted)."""
    deadline = time.monotonic() + 30
    last, stable_since = None, time.monotonic()
    while True:
        now = _slow_counts(client)
        delta = (now[0] - before[0], now[1] - before[1], now[2] - before[2])
        if delta != last:
            last, stable_since = delta, time.monotonic()
        if delta[0] + delta[1] >= total or time.monotonic() - stable_since > 1.5:
            return delta
        if time.monotonic() > deadline:
            return delta
        time.sleep(0.05)


def test_client_cancellation_drops_queued_requests(
    server: Any, grpc_client: grpcclient.InferenceServerClient
) -> None:
    """Requests cancelled by the client while queued behind slow ones never execute."""
    before = _slow_counts(grpc_client)
    data = np.ones((1, 16), np.float32)

    async def main() -> None:
        client = aioclient.InferenceServerClient(server.grpc_url)

        def infer() -> asyncio.Future[Any]:
            return asyncio.ensure_future(
                client.infer("slow_fp32", [one_input("INPUT0", data, "FP32")])
            )

        try:
            blockers = [infer() for _ in range(6)]  # ~30 ms each, one at a time
            await asyncio.sleep(0.01)
            queued = [infer() for _ in range(6)]
            # cancel only once the server holds all six behind a blocker that still runs
            # (a slow machine may take longer than the blockers to send them otherwise)
            deadline = time.monotonic() + 10
            while await asyncio.to_thread(_pending, server) < 7 and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
            for task in queued:
                task.cancel()
            await asyncio.gather(*queued, return_exceptions=True)
            await asyncio.gather(*blockers)
        finally:
            await client.close()

    asyncio.run(main())
    succeeded, failed, executions = wait_for_accounting(grpc_client, before, 12)
    # the blockers succeed; cancelled requests fail as CANCELED, and those still queued when
    # cancelled never execute
    assert succeeded >= 6 and failed >= 1, (succeeded, failed, executions)
    assert executions < succeeded + failed <= 12, (succeeded, failed, executions)
