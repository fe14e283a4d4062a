"""ModelStreamInfer: many requests on one stream, in-band errors, cancellation."""

from __future__ import annotations

import asyncio
import queue
import time
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2 as pb


def simple_inputs(a: np.ndarray) -> list[grpcclient.InferInput]:
    tensors = []
    for name in ("INPUT0", "INPUT1"):
        tensor = grpcclient.InferInput(name, list(a.shape), "INT32")
        tensor.set_data_from_numpy(a)
        tensors.append(tensor)
    return tensors


def stream_request(model: str, request_id: str, data: np.ndarray) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=list(data.shape))
    request.raw_input_contents.append(data.tobytes())
    return request


def open_stream(channel: grpc.Channel, requests: Any) -> Any:
    call = channel.stream_stream(
        "/inference.GRPCInferenceService/ModelStreamInfer",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=pb.ModelStreamInferResponse.FromString,
    )
    return call(requests, timeout=60)


def test_many_requests_on_one_stream(server: Any) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for i in range(60):
            a = np.full((1, 16), i, np.int32)
            client.async_stream_infer("simple", simple_inputs(a), request_id=f"req-{i}")
        seen = {}
        for _ in range(60):
            result, error = results.get(timeout=30)
            assert error is None
            response = result.get_response()
            seen[response.id] = result.as_numpy("OUTPUT0")
            assert response.parameters["triton_final_response"].bool_param is True
        assert sorted(seen) == sorted(f"req-{i}" for i in range(60))
        for i in range(60):
            assert (seen[f"req-{i}"] == 2 * i).all()
    finally:
        client.stop_stream()
        client.close()


def test_errors_are_in_band_and_the_stream_goes_on(grpc_channel: grpc.Channel) -> None:
    good = np.arange(4, dtype=np.float32).reshape(1, 4)
    requests = [
        stream_request("identity_fp32", "ok-1", good),
        stream_request("no_such_model", "missing", good),
        stream_request("identity_fp32", "bad-shape", good.reshape(1, 2, 2)),
        stream_request("identity_fp32", "ok-2", good * 2),
    ]
    bad_param = stream_request("identity_fp32", "reserved", good)
    bad_param.parameters["triton_x"].bool_param = True
    requests.append(bad_param)
    responses = {r.infer_response.id: r for r in open_stream(grpc_channel, iter(requests))}
    assert set(responses) == {"ok-1", "missing", "bad-shape", "ok-2", "reserved"}
    for name, factor in (("ok-1", 1), ("ok-2", 2)):
        response = responses[name]
        assert response.error_message == ""
        output = np.frombuffer(response.infer_response.raw_output_contents[0], np.float32)
        assert (output == good.reshape(-1) * factor).all()
    assert "no_such_model" in responses["missing"].error_message
    assert responses["bad-shape"].error_message.startswith(
        "[request id: bad-shape] unexpected shape for input 'INPUT0'"
    )
    assert "reserved for Triton usage" in responses["reserved"].error_message


def test_sync_client_stream_reports_errors(server: Any) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        a = np.ones((1, 16), np.int32)
        client.async_stream_infer("no_such_model", simple_inputs(a), request_id="x")
        client.async_stream_infer("simple", simple_inputs(a), request_id="y")
        outcomes = [results.get(timeout=30) for _ in range(2)]
        errors = [error for _, error in outcomes if error is not None]
        successes = [result for result, error in outcomes if error is None]
        assert len(errors) == 1 and "no_such_model" in errors[0].message()
        assert successes[0].get_response().id == "y"
    finally:
        client.stop_stream()
        client.close()


def test_aio_stream(server: Any) -> None:
    async def main() -> None:
        client = aioclient.InferenceServerClient(server.grpc_url)

        async def requests() -> Any:
            for i in range(20):
                yield {
                    "model_name": "simple",
                    "inputs": simple_inputs(np.full((1, 16), i, np.int32)),
                    "request_id": str(i),
                }

        try:
            seen = {}
            async for result, error in client.stream_infer(requests()):
                assert error is None
                seen[result.get_response().id] = result.as_numpy("OUTPUT1")
            assert sorted(seen, key=int) == [str(i) for i in range(20)]
            assert all((v == 0).all() for v in seen.values())
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


def test_cancelling_the_stream_cancels_its_requests(
    grpc_channel: grpc.Channel, grpc_client: grpcclient.InferenceServerClient
) -> None:
    before = _slow_counts(grpc_client)
    outbox: queue.Queue[pb.ModelInferRequest | None] = queue.Queue()

    def requests() -> Any:
        while True:
            item = outbox.get()
            if item is None:
                return
            yield item

    call = open_stream(grpc_channel, requests())
    data = np.ones((1, 16), np.float32)
    for i in range(8):  # ~30 ms each, one at a time: most are still queued below
        outbox.put(stream_request("slow_fp32", f"s{i}", data))
    first = next(call)  # the first response arrived: the others are on the server
    assert first.error_message == ""
    call.cancel()
    outbox.put(None)
    # every request is accounted for, and the ones still queued never executed
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = _slow_counts(grpc_client)
        if (now[0] - before[0]) + (now[1] - before[1]) >= 8:
            break
        time.sleep(0.05)
    succeeded, failed, executions = (now[0] - before[0], now[1] - before[1], now[2] - before[2])
    assert succeeded + failed == 8
    assert failed >= 1, (succeeded, failed, executions)
    assert executions < 8
    # the server goes on serving
    assert grpc_client.is_model_ready("slow_fp32")


def test_stream_half_close_waits_for_in_flight(grpc_channel: grpc.Channel) -> None:
    """Closing the request side still delivers every response before the stream ends."""
    data = np.ones((1, 16), np.float32)
    requests = [stream_request("slow_fp32", f"h{i}", data) for i in range(3)]
    ids = []
    for response in open_stream(grpc_channel, iter(requests)):
        assert response.error_message == ""
        ids.append(response.infer_response.id)
    assert sorted(ids) == ["h0", "h1", "h2"]
