"""Requests that must cost no more than their size (issue 42): protobuf tags that cannot be,
a million empty fields, compressed zeros, long names echoed into grpc-message. In process
where it can be; then on the session server, which must keep serving."""

from __future__ import annotations

import gzip
import time
from typing import Any

import grpc
import pytest
from grpc_testlib import many_inputs_request, raw_infer, simple_request
from tritonclient.grpc import service_pb2 as pb

from oceanus.core.errors import InferenceServerError
from oceanus.core.types import InferRequest
from oceanus.frontends.grpc import codec
from oceanus.frontends.grpc_transport import framing
from oceanus.frontends.grpc_transport.call import (
    MAX_DETAILS,
    RESPONSE_HEADERS,
    Compressed,
    MessageReader,
    status_trailers,
)


def _framed(message: bytes, flag: int = 0) -> bytes:
    return bytes((flag,)) + len(message).to_bytes(4, "big") + message


def _timed(function: Any, *args: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    try:
        result = function(*args)
    except Exception as exc:  # the outcome is checked by the caller
        result = exc
    return time.perf_counter() - started, result


# Each is 2 MiB: before issue 42 each held the loop for seconds (a Python step per field).
HOSTILE = {
    "zeros (field 0)": b"\0" * (2 << 20),
    "empty raw contents": b"\x3a\x00" * (1 << 20),
    "empty inputs": b"\x2a\x00" * (1 << 20),
    "varints of field 1": b"\x08\x00" * (1 << 20),
    "groups": b"\x0b\x0c" * (1 << 20),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_messages_parse_at_the_c_parsers_speed(name: str) -> None:
    seconds, result = _timed(codec.decode, HOSTILE[name])
    assert seconds < 0.5, f"{name}: {seconds:.2f} s"
    # a valid message (empty fields) decodes to a request the core refuses; others are refused
    if not isinstance(result, InferRequest):
        assert isinstance(result, InferenceServerError), result
        assert result.code.name == "INVALID_ARG"


def test_field_zero_is_refused_at_once_by_the_split() -> None:
    message = pb.ModelInferRequest(model_name="simple")
    message.inputs.add(name="INPUT0", datatype="INT8", shape=[1 << 20])
    message.raw_input_contents.append(b"\1" * (1 << 20))
    data = message.SerializeToString() + b"\0\0"
    with pytest.raises(InferenceServerError):
        codec.parse_infer_request(data)


def test_a_large_request_still_splits_its_contents_without_copying() -> None:
    message = pb.ModelInferRequest(model_name="simple", id="x")
    for name in ("A", "B"):
        message.inputs.add(name=name, datatype="INT8", shape=[1 << 19])
        message.raw_input_contents.append(bytes([len(name)]) * (1 << 19))
    message.parameters["key"].int64_param = 5
    parsed, raw = codec.parse_infer_request(message.SerializeToString())
    assert all(isinstance(piece, memoryview) for piece in raw)
    assert [bytes(piece[:1]) for piece in raw] == [b"\1", b"\1"]
    assert parsed.id == "x" and parsed.parameters["key"].int64_param == 5
    assert [io.name for io in parsed.inputs] == ["A", "B"]


def test_a_request_of_many_fields_is_parsed_whole_with_its_contents() -> None:
    """Past MAX_SPLIT_FIELDS the C parser takes the whole message: same request."""
    message = pb.ModelInferRequest(model_name="simple")
    message.inputs.add(name="INPUT0", datatype="INT8", shape=[1 << 18])
    message.raw_input_contents.append(b"\7" * (1 << 18))
    for n in range(codec.MAX_SPLIT_FIELDS + 1):
        message.parameters[f"p{n}"].int64_param = n
    request = codec.decode(message.SerializeToString())
    assert request.inputs[0].data.nbytes == 1 << 18
    assert request.parameters["p1024"] == 1024


def test_large_compressed_messages_are_inflated_off_the_loop() -> None:
    bomb = gzip.compress(b"\0" * (8 << 20))
    assert len(bomb) > 4096
    reader = MessageReader(b"gzip", 2**31 - 1)
    seconds, messages = _timed(reader.feed, _framed(bomb, 1))
    assert seconds < 0.05
    assert len(messages) == 1 and isinstance(messages[0], Compressed)
    small = gzip.compress(b"z" * 999)
    assert MessageReader(b"gzip", 1000).feed(_framed(small, 1)) == [b"z" * 999]


def test_long_client_strings_are_cut_and_encoded_in_linear_time() -> None:
    conn = framing.Http2(_Silent())
    for size in (100_000, 300_000):
        text = f"Request for unknown model: '{'m' * size}' is not found"
        trailers = status_trailers(grpc.StatusCode.NOT_FOUND, text)
        assert len(trailers[1][1]) == MAX_DETAILS
        assert trailers[1][1].endswith(b"...")
        seconds, _ = _timed(conn.send_headers, 1, [(b"x-long", b"v" * size)])
        assert seconds < 0.1, f"{size}: {seconds:.2f} s"
        conn.data_to_send()
    name = "m" * 200
    short = status_trailers(grpc.StatusCode.NOT_FOUND, f"Request for unknown model: '{name}'")
    assert short[1][1] == f"Request for unknown model: '{name}'".encode()
    conn.send_headers(1, RESPONSE_HEADERS + short)


class _Silent:
    def __getattr__(self, name: str) -> Any:
        return lambda *args: None


# ---- on the session server -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "compression", "code"),
    [
        (b"\0" * (8 << 20), grpc.Compression.Gzip, grpc.StatusCode.INVALID_ARGUMENT),
        (b"\0" * (2 << 20), None, grpc.StatusCode.INVALID_ARGUMENT),
        (b"\x3a\x00" * (1 << 20), None, grpc.StatusCode.NOT_FOUND),  # valid: model ''
    ],
    ids=["8 MiB of gzip zeros", "2 MiB of zeros", "a million empty raw contents"],
)
def test_hostile_bodies_are_refused_quickly_and_the_server_serves_on(
    grpc_channel: grpc.Channel, payload: bytes, compression: Any, code: grpc.StatusCode
) -> None:
    started = time.monotonic()
    answer = raw_infer(grpc_channel, payload, compression=compression)
    assert time.monotonic() - started < 2
    assert isinstance(answer, grpc.RpcError)
    assert answer.code() == code
    assert isinstance(raw_infer(grpc_channel, simple_request()), bytes)


def test_a_long_model_name_is_answered_quickly_in_triton_words(grpc_channel: grpc.Channel) -> None:
    request = pb.ModelInferRequest(model_name="m" * 300_000)
    started = time.monotonic()
    answer = raw_infer(grpc_channel, request.SerializeToString())
    assert time.monotonic() - started < 2
    assert isinstance(answer, grpc.RpcError)
    assert len(answer.details()) <= MAX_DETAILS
    assert answer.details().startswith("Request for unknown model: 'mmm")


def test_a_request_naming_many_tensors_is_refused_and_the_server_serves_on(
    grpc_channel: grpc.Channel,
) -> None:
    answer = raw_infer(grpc_channel, many_inputs_request())
    assert isinstance(answer, grpc.RpcError)
    assert answer.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(answer.details()) <= MAX_DETAILS
    stream = grpc_channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
    responses = list(stream(iter([many_inputs_request(), simple_request()]), timeout=30))
    first, second = (pb.ModelStreamInferResponse.FromString(r) for r in responses)
    assert first.error_message == "[request id: <id_unknown>] input 'I' already exists in request"
    assert not second.error_message
    assert isinstance(raw_infer(grpc_channel, simple_request()), bytes)
