"""Core responses -> `inference.ModelInferResponse` / `ModelStreamInferResponse` wire bytes.

Responses are written as protobuf wire bytes directly: the parts that repeat between responses
(model name and version, each output's name, datatype and shape) are encoded once and cached,
and each output's tensor bytes are appended as `raw_output_contents` without an intermediate
message object.
"""

from __future__ import annotations

from typing import Any

from tritonclient.grpc import service_pb2 as pb

from oceanus.core.errors import InferenceServerError
from oceanus.core.tensor_bytes import array_to_bytes
from oceanus.core.types import InferResponse

_SMALL_VARINTS = [bytes([n]) for n in range(128)]


def _varint(value: int) -> bytes:
    if value < 128:
        if value >= 0:
            return _SMALL_VARINTS[value]
        value += 1 << 64  # int64 as protobuf encodes it: ten bytes of two's complement
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    """A length-delimited field (tag already holds field number and wire type 2)."""
    return bytes([tag]) + _varint(len(payload)) + payload


# ---- messages -------------------------------------------------------------------------------

_CACHE_LIMIT = 4096
# Outputs smaller than this are copied out with one tobytes() call; larger ones are joined from
# a view of the array (one copy fewer).
SMALL_OUTPUT = 64 * 1024
_header_cache: dict[tuple[str, str], bytes] = {}
_output_cache: dict[tuple[str, str, tuple[int, ...]], bytes] = {}

_RAW_OUTPUT_TAG = b"\x32"  # ModelInferResponse.raw_output_contents (field 6)
_EMPTY_RAW_OUTPUT = _RAW_OUTPUT_TAG + b"\x00"
_STREAM_RESPONSE_TAG = b"\x12"  # ModelStreamInferResponse.infer_response (field 2)


def _header(model_name: str, model_version: str) -> bytes:
    key = (model_name, model_version)
    encoded = _header_cache.get(key)
    if encoded is None:
        encoded = b""
        if model_name:
            encoded += _field(0x0A, model_name.encode())
        if model_version:
            encoded += _field(0x12, model_version.encode())
        if len(_header_cache) >= _CACHE_LIMIT:
            _header_cache.clear()
        _header_cache[key] = encoded
    return encoded


def _output_entry(name: str, datatype: str, shape: tuple[int, ...]) -> bytes:
    key = (name, datatype, shape)
    encoded = _output_cache.get(key)
    if encoded is None:
        body = _field(0x0A, name.encode()) + _field(0x12, datatype.encode())
        if shape:
            body += _field(0x1A, b"".join(_varint(int(d)) for d in shape))
        encoded = _field(0x2A, body)
        if len(_output_cache) >= _CACHE_LIMIT:
            _output_cache.clear()
        _output_cache[key] = encoded
    return encoded


def _to_parameter(value: Any) -> pb.InferParameter:
    if isinstance(value, bool):
        return pb.InferParameter(bool_param=value)
    if isinstance(value, int):
        return pb.InferParameter(int64_param=value)
    if isinstance(value, float):
        return pb.InferParameter(double_param=value)
    return pb.InferParameter(string_param=str(value))


def encode_parameters(parameters: dict[str, Any]) -> bytes:
    """The `parameters` map entries of a ModelInferResponse, as wire bytes."""
    message = pb.ModelInferResponse()
    for key, value in parameters.items():
        message.parameters[key].CopyFrom(_to_parameter(value))
    data: bytes = message.SerializeToString()
    return data


FINAL_RESPONSE_PARAMETER = encode_parameters({"triton_final_response": True})


def _response_parts(response: InferResponse, extra: bytes = b"") -> list[Any]:
    parts: list[Any] = [_header(response.model_name, response.model_version)]
    if response.id:
        parts.append(_field(0x1A, response.id.encode()))
    if response.parameters:
        parts.append(encode_parameters(response.parameters))
    if extra:
        parts.append(extra)
    chunks: list[Any] = []
    requested = response.requested
    for tensor in response.outputs:
        parts.append(_output_entry(tensor.name, tensor.datatype, tensor.shape))
        if requested is not None:
            wanted = requested.get(tensor.name)
            if wanted is not None and wanted.shm is not None:
                # written to the client's region: an empty raw_output_contents, as Triton sends
                chunks.append(_EMPTY_RAW_OUTPUT)
                continue
        data = tensor.data
        if data.nbytes < SMALL_OUTPUT and data.dtype.kind != "O":
            chunk: Any = data.tobytes()  # one call beats a view for small tensors
        else:
            chunk = array_to_bytes(data, tensor.datatype)
        chunks.append(_RAW_OUTPUT_TAG)
        chunks.append(_varint(len(chunk)))
        chunks.append(chunk)
    parts.extend(chunks)
    return parts


def encode_infer_response(response: InferResponse) -> bytes:
    """A serialized ModelInferResponse: every output in raw_output_contents, in order."""
    return b"".join(_response_parts(response))


def encode_stream_response(response: InferResponse, marked: bool = False) -> bytes:
    """A serialized ModelStreamInferResponse carrying a successful response: the one and final
    response of its request, unless `marked` (a decoupled model's response whose parameters
    already say whether it is the final one)."""
    parts = _response_parts(response, b"" if marked else FINAL_RESPONSE_PARAMETER)
    size = sum(len(p) for p in parts)
    return b"".join([_STREAM_RESPONSE_TAG, _varint(size), *parts])


def encode_stream_error(
    error: InferenceServerError | str,
    request_id: str,
    model_name: str = "",
    model_version: str = "",
    final: bool = False,
) -> bytes:
    """A serialized ModelStreamInferResponse carrying a request's error in-band."""
    message = error.message if isinstance(error, InferenceServerError) else error
    inner = pb.ModelInferResponse(id=request_id, model_name=model_name, model_version=model_version)
    if final:
        inner.parameters["triton_final_response"].bool_param = True
    data: bytes = pb.ModelStreamInferResponse(
        error_message=message, infer_response=inner
    ).SerializeToString()
    return data
