"""Hostile gRPC: lies in raw and typed contents, version strings that only look like numbers,
unknown fields, streams abandoned half-way: a clear status, never INTERNAL for a client's
mistake, and the server keeps serving (issue 18)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from grpc_testlib import unary
from tritonclient.grpc import service_pb2 as pb


def _simple_request(model: str = "simple", version: str = "") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, model_version=version)
    for name in ("INPUT0", "INPUT1"):
        tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        del tensor
        request.raw_input_contents.append(np.full(16, 2, dtype=np.int32).tobytes())
    return request


def _call(channel: grpc.Channel, method: str, request: Any, response_type: Any) -> Any:
    try:
        return unary(channel, method, request, response_type)
    except grpc.RpcError as error:
        return error


@pytest.fixture(autouse=True)
def still_serving(grpc_channel: grpc.Channel) -> Iterator[None]:
    yield
    response = unary(grpc_channel, "ModelInfer", _simple_request(), pb.ModelInferResponse)
    assert np.frombuffer(response.raw_output_contents[0], dtype=np.int32)[0] == 4


# A superscript two, Arabic-Indic one and three: digits to str.isdigit, not numbers to Triton.
@pytest.mark.parametrize("version", ["\u00b2", "\u0661", "+ 1", "\u0663"])
@pytest.mark.parametrize(
    ("method", "request_type", "response_type"),
    [
        ("ModelInfer", None, pb.ModelInferResponse),
        ("ModelMetadata", pb.ModelMetadataRequest, pb.ModelMetadataResponse),
        ("ModelConfig", pb.ModelConfigRequest, pb.ModelConfigResponse),
        ("ModelStatistics", pb.ModelStatisticsRequest, pb.ModelStatisticsResponse),
        ("ModelReady", pb.ModelReadyRequest, pb.ModelReadyResponse),
    ],
)
def test_versions_are_ascii_numbers(
    grpc_channel: grpc.Channel, version: str, method: str, request_type: Any, response_type: Any
) -> None:
    """A version string that is a digit to str.isdigit but not an ASCII number never reaches
    version 1 and never answers INTERNAL: Triton 2.51's INVALID_ARGUMENT and words, for every
    RPC that names a version (checked against the reference Triton)."""
    if request_type is None:
        request = _simple_request(version=version)
    else:
        request = request_type(name="simple", version=version)
    answer = _call(grpc_channel, method, request, response_type)
    assert isinstance(answer, grpc.RpcError), f"{version!r} served: {answer}"
    assert answer.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert answer.details() == (
        f"failed to get model version from specified version string '{version}' (details: "
        "stol), version should be an integral value > 0"
    )


def test_raw_contents_that_lie_are_invalid_arguments(grpc_channel: grpc.Channel) -> None:
    request = _simple_request()
    request.raw_input_contents[1] = b"\x00" * 7  # not 64 bytes, not a whole INT32
    answer = _call(grpc_channel, "ModelInfer", request, pb.ModelInferResponse)
    assert isinstance(answer, grpc.RpcError)
    assert answer.code() == grpc.StatusCode.INVALID_ARGUMENT
    request = _simple_request()
    request.raw_input_contents.append(b"\x00" * 64)  # more contents than inputs: ignored
    answer = _call(grpc_channel, "ModelInfer", request, pb.ModelInferResponse)
    assert isinstance(answer, pb.ModelInferResponse)  # as Triton 2.51 answers


def test_typed_contents_that_lie_are_invalid_arguments(grpc_channel: grpc.Channel) -> None:
    request = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        tensor.contents.int_contents.extend([1] * 15)  # one short
    answer = _call(grpc_channel, "ModelInfer", request, pb.ModelInferResponse)
    assert answer.code() == grpc.StatusCode.INVALID_ARGUMENT
    request = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        tensor = request.inputs.add(name=name, datatype="INT32", shape=[2**62, 16])
        tensor.contents.int_contents.extend([1] * 16)
    answer = _call(grpc_channel, "ModelInfer", request, pb.ModelInferResponse)
    assert answer.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_unknown_fields_are_ignored(grpc_channel: grpc.Channel) -> None:
    """Bytes of a field this schema does not know (a newer client's) parse as unknown fields."""
    data = _simple_request().SerializeToString() + b"\xf8\x3f\x01"  # field 1023, varint 1
    call = grpc_channel.unary_unary(
        "/inference.GRPCInferenceService/ModelInfer",
        request_serializer=lambda raw: raw,
        response_deserializer=pb.ModelInferResponse.FromString,
    )
    response = call(data, timeout=30)
    assert np.frombuffer(response.raw_output_contents[0], dtype=np.int32)[0] == 4


def test_streams_abandoned_half_way_leave_nothing_behind(server: Any) -> None:
    """Streams closed with requests in flight, and calls cancelled, again and again: the server
    answers the next requests as before."""
    for _ in range(20):
        client = grpcclient.InferenceServerClient(server.grpc_url)
        client.start_stream(callback=lambda result, error: None)
        inputs = []
        for name in ("INPUT0", "INPUT1"):
            tensor = grpcclient.InferInput(name, [1, 16], "INT32")
            tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
            inputs.append(tensor)
        for _ in range(5):
            client.async_stream_infer("simple", inputs)
        client.stop_stream(cancel_requests=True)
        client.close()
    channel = grpc.insecure_channel(server.grpc_url)
    call = channel.unary_unary(
        "/inference.GRPCInferenceService/ModelInfer",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=pb.ModelInferResponse.FromString,
    )
    futures = [call.future(_simple_request(), timeout=30) for _ in range(10)]
    for future in futures[::2]:
        future.cancel()
    for future in futures[1::2]:
        assert np.frombuffer(future.result().raw_output_contents[0], np.int32)[0] == 4
    channel.close()


def test_millions_of_empty_strings_are_invalid_arguments(grpc_channel: grpc.Channel) -> None:
    """4 M empty BYTES elements: refused from the shape, before anything is decoded."""
    count = 4_000_000
    for shape, words in (
        ([1, count], f"has {count} string elements, more than the"),
        ([1, 1], "expected 1 string elements for inference input 'INPUT0'"),
    ):
        request = pb.ModelInferRequest(model_name="identity_bytes")
        request.inputs.add(name="INPUT0", datatype="BYTES", shape=shape)
        request.raw_input_contents.append(bytes(4 * count))
        answer = _call(grpc_channel, "ModelInfer", request, pb.ModelInferResponse)
        assert isinstance(answer, grpc.RpcError)
        assert answer.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert words in str(answer.details())
