"""`inference.ModelInferRequest` -> core requests.

Requests are parsed by protobuf's C implementation; a large request is first split at the top level
so that its `raw_input_contents` stay views into the received message bytes (no copy) while only the
small rest goes through the protobuf parser. Responses: frontends/grpc/responses.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from oceanus.core import datatypes
from oceanus.core.datatypes import INVALID_DATATYPE, DataType
from oceanus.core.errors import invalid_arg
from oceanus.core.shared_memory import NO_REGIONS, SharedMemoryManager, as_unsigned
from oceanus.core.tensor_bytes import array_from_bytes
from oceanus.core.types import InferRequest, RequestedOutput, Tensor, is_number

# Requests at least this large are split so their tensors are not copied out of the message.
ZERO_COPY_THRESHOLD = 256 * 1024

# Request parameter keys starting with "triton_" that clients may send (Triton's list).
TRITON_RESERVED_PARAMS = ("triton_enable_empty_final_response",)
# The data of an input the core refuses by its datatype (never read).
_NO_DATA = np.empty(0, dtype=np.uint8)

_RAW_INPUT_TAG = (7 << 3) | 2  # ModelInferRequest.raw_input_contents


# ---- protobuf wire helpers ------------------------------------------------------------------


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise DecodeError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


# The split below walks the top-level fields in Python: a request has a few per input and
# parameter. A message with more (or a field this walk does not expect: field number 0, a
# group, a wire type that does not exist) is parsed whole by protobuf's C parser, which is linear
# and refuses malformed bytes at once; a Python walk of a million two-byte fields held the
# event loop for seconds (issue 42).
MAX_SPLIT_FIELDS = 1024


class _NotSplit(Exception):
    """The message is not one the split takes: parse it whole."""


def _split_raw_inputs(data: bytes) -> tuple[bytes, list[memoryview]]:
    """The message without its raw_input_contents, and those contents as views into `data`.
    Raises _NotSplit past MAX_SPLIT_FIELDS fields or on a tag it does not expect."""
    view = memoryview(data)
    kept: list[memoryview] = []
    raw: list[memoryview] = []
    pos, end = 0, len(data)
    kept_from = 0  # where the run of kept fields being gathered starts
    for _ in range(MAX_SPLIT_FIELDS):
        if pos >= end:
            break
        start = pos
        tag, pos = _read_varint(data, pos)
        wire_type = tag & 7
        if tag < 8:  # field number 0
            raise _NotSplit
        if wire_type == 2:
            length, pos = _read_varint(data, pos)
            stop = pos + length
            if stop > end:
                raise DecodeError("truncated field")
            if tag == _RAW_INPUT_TAG:
                if kept_from < start:
                    kept.append(view[kept_from:start])
                raw.append(view[pos:stop])
                pos = kept_from = stop
                continue
            pos = stop
        elif wire_type == 0:
            _, pos = _read_varint(data, pos)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        else:
            raise _NotSplit
        if pos > end:
            raise DecodeError("truncated field")
    else:
        if pos < end:
            raise _NotSplit
    if kept_from < end:
        kept.append(view[kept_from:end])
    return b"".join(kept), raw


def parse_infer_request(
    data: bytes,
) -> tuple[pb.ModelInferRequest, Sequence[bytes] | Sequence[memoryview]]:
    """The parsed message and its raw input contents (views into `data` when it is large).

    Costs what the bytes are worth: a message the split does not take is parsed whole in C, and
    its raw contents are left in the message (read one by one as inputs need them, never all
    copied out: contents past the inputs are ignored, as by Triton)."""
    try:
        if len(data) >= ZERO_COPY_THRESHOLD:
            try:
                rest, raw = _split_raw_inputs(data)
            except _NotSplit:
                pass
            else:
                return pb.ModelInferRequest.FromString(rest), raw
        message = pb.ModelInferRequest.FromString(data)
        return message, message.raw_input_contents
    except DecodeError as exc:
        raise invalid_arg(f"failed to parse the inference request: {exc}") from None


# ---- versions and parameters ------------------------------------------------------------------


def check_version(version: str) -> None:
    """Triton's gRPC check of a model version string (an integer, or empty for "latest")."""
    if not version:
        return
    digits = version.strip()
    if digits[:1] in ("+", "-"):
        digits = digits[1:]
    if not is_number(digits):
        raise invalid_arg(
            f"failed to get model version from specified version string '{version}' "
            "(details: stol), version should be an integral value > 0"
        )
    if int(version) < 0:
        raise invalid_arg(
            f"invalid model version specified '{version}' , version should be an integral value > 0"
        )


def parameter_value(parameter: pb.InferParameter) -> Any:
    kind = parameter.WhichOneof("parameter_choice")
    return None if kind is None else getattr(parameter, kind)


def _request_parameters(parameters: Any) -> dict[str, Any]:
    """Request parameters as the core reads them, checked as Triton's gRPC frontend checks them."""
    result: dict[str, Any] = {}
    for key, parameter in parameters.items():
        kind = parameter.WhichOneof("parameter_choice")
        if key == "sequence_id":
            if kind not in ("int64_param", "string_param"):
                raise invalid_arg(
                    "invalid value type for 'sequence_id' parameter, expected int64_param or "
                    "string_param."
                )
        elif key in ("sequence_start", "sequence_end"):
            if kind != "bool_param":
                raise invalid_arg(f"invalid value type for '{key}' parameter, expected bool_param.")
        elif key == "priority":
            if kind == "int64_param":
                if parameter.int64_param < 0:
                    raise invalid_arg("invalid value for 'priority', expected value >= 0.")
            elif kind != "uint64_param":
                raise invalid_arg(
                    "invalid value type for 'priority' parameter, expected int64_param or "
                    "uint64_param."
                )
        elif key == "timeout":
            if kind != "int64_param":
                raise invalid_arg(
                    "invalid value type for 'timeout' parameter, expected int64_param."
                )
        elif key.startswith("triton_"):
            if key not in TRITON_RESERVED_PARAMS:
                raise invalid_arg(
                    "parameter keys starting with 'triton_' are reserved for Triton usage. Only "
                    "the following keys starting with 'triton_' are allowed: "
                    + " ".join(TRITON_RESERVED_PARAMS)
                )
            if kind != "bool_param":
                raise invalid_arg(f"invalid value type for '{key}' parameter, expected bool_param.")
        elif kind not in ("int64_param", "bool_param", "string_param", "double_param"):
            raise invalid_arg(
                f"invalid value type for '{key}' parameter, expected int64_param, bool_param, "
                "or string_param."
            )
        result[key] = getattr(parameter, kind)
    return result


ShmParameters = tuple[str, int, int]  # region, offset, byte size


def _tensor_parameters(parameters: Any, name: str) -> tuple[dict[str, Any], ShmParameters | None]:
    """A tensor's parameters, and where it lies in shared memory when it names a region
    (checked as Triton's ParseSharedMemoryParams checks them)."""
    result = {key: parameter_value(p) for key, p in parameters.items()}
    region = parameters.get("shared_memory_region")
    if region is not None and region.WhichOneof("parameter_choice") != "string_param":
        raise invalid_arg(
            f"invalid value type for 'shared_memory_region' parameter for tensor '{name}', "
            "expected string_param."
        )
    values = [0, 0]
    for index, key in enumerate(("shared_memory_offset", "shared_memory_byte_size")):
        parameter = parameters.get(key)
        if parameter is None:
            if index == 1 and region is not None:
                raise invalid_arg(
                    "'shared_memory_byte_size' must be specified along with "
                    f"'shared_memory_region' parameter for tensor '{name}'"
                )
            continue
        if region is None:
            raise invalid_arg(
                f"'{key}' can not be specified without 'shared_memory_region' parameter for "
                f"tensor '{name}'"
            )
        if parameter.WhichOneof("parameter_choice") != "int64_param":
            raise invalid_arg(
                f"invalid value type for '{key}' parameter for tensor '{name}', expected "
                "int64_param."
            )
        values[index] = as_unsigned(parameter.int64_param)  # size_t in Triton
    if region is None:
        return result, None
    return result, (region.string_param, values[0], values[1])


# ---- typed `contents` -----------------------------------------------------------------------

# contents field -> (datatype it carries by default, datatypes it may also carry, numpy dtype
# of the field's values)
_CONTENTS: dict[str, tuple[str, tuple[str, ...], Any]] = {
    "bool_contents": ("BOOL", ("BOOL",), np.bool_),
    "int_contents": ("INT32", ("INT8", "INT16", "INT32"), np.int32),
    "int64_contents": ("INT64", ("INT64",), np.int64),
    "uint_contents": ("UINT32", ("UINT8", "UINT16", "UINT32"), np.uint32),
    "uint64_contents": ("UINT64", ("UINT64",), np.uint64),
    "fp32_contents": ("FP32", ("FP32",), np.float32),
    "fp64_contents": ("FP64", ("FP64",), np.float64),
    "bytes_contents": ("BYTES", ("BYTES",), object),
}


def _from_contents(
    contents: pb.InferTensorContents, name: str, model_name: str, datatype: DataType
) -> np.ndarray:
    found: np.ndarray | None = None
    for field, (natural, allowed, field_dtype) in _CONTENTS.items():
        values = getattr(contents, field)
        if not values:
            continue
        if found is not None:
            raise invalid_arg(
                f"unexpected explicit tensor data for input tensor '{name}' for model "
                f"'{model_name}', binary data was already supplied."
            )
        if datatype.name not in allowed:
            raise invalid_arg(
                f"unexpected explicit tensor data for input tensor '{name}' for model "
                f"'{model_name}' of type '{natural}', expected datatype '{datatype.name}'"
            )
        if field_dtype is object:
            found = np.empty(len(values), dtype=object)
            found[:] = list(values)
        else:
            found = np.array(values, dtype=field_dtype)
            if found.dtype != datatype.dtype:
                found = found.astype(datatype.dtype)  # INT8/16 and UINT8/16 keep the low bytes
    if found is None:
        found = np.empty(0, dtype=datatype.dtype)
    return found


# ---- requests -------------------------------------------------------------------------------


def decode_infer_request(
    message: pb.ModelInferRequest,
    raw: Sequence[bytes] | Sequence[memoryview],
    shm: SharedMemoryManager = NO_REGIONS,
) -> InferRequest:
    """Build a core request from a parsed ModelInferRequest and its raw input contents.

    Tensors may name regions of `shm` (the system shared memory extension) instead of carrying
    data; raw_input_contents then hold only the other inputs, in order."""
    model_name = message.model_name
    model_version = message.model_version
    if model_version:
        check_version(model_version)
    request = InferRequest(model_name=model_name, model_version=model_version, id=message.id)
    if message.parameters:
        request.parameters = _request_parameters(message.parameters)
    inputs = request.inputs
    index = 0
    for io in message.inputs:
        name = io.name
        datatype = datatypes.from_name(io.datatype)
        # Negative dimensions pass: the core refuses them in Triton's words (a batch size that
        # does not match, an unexpected shape, a byte size mismatch), as Triton 2.51 does.
        shape = tuple(io.shape)
        parameters: dict[str, Any] = {}
        in_shm = None
        if io.parameters:
            parameters, in_shm = _tensor_parameters(io.parameters, name)
        if datatype is None:
            # Triton checks the data's presence here and the datatype later, in its core, with
            # the model's: "data-type is '<invalid>'" (its name of an unknown datatype).
            index = _skip_data(io, raw, index, in_shm, name, model_name)
            inputs.append(Tensor(name, INVALID_DATATYPE, shape, _NO_DATA, parameters))
            continue
        if in_shm is not None:
            if io.HasField("contents"):
                raise invalid_arg(
                    "unexpected 'content' provided when using shared memory for input tensor "
                    f"'{name}' for model '{model_name}'"
                )
            if request.shm_regions is None:
                request.shm_regions = []
            view = shm.input_view(*in_shm, request.shm_regions)
            data = array_from_bytes(name, datatype, view, shape, model_name, request.id)
        elif io.HasField("contents"):
            if raw:
                raise invalid_arg(
                    "contents field must not be specified when using raw_input_contents for "
                    f"'{name}' for model '{model_name}'"
                )
            data = _from_contents(io.contents, name, model_name, datatype)
        elif index < len(raw):
            data = array_from_bytes(name, datatype, raw[index], shape, model_name, request.id)
            index += 1
        else:
            raise invalid_arg(
                f"unable to find data for input tensor '{name}' for model '{model_name}' in "
                "request."
            )
        inputs.append(Tensor(name, io.datatype, shape, data, parameters))
    if message.outputs:
        request.outputs = _requested_outputs(message.outputs, request, shm)
    return request


def _skip_data(
    io: Any,
    raw: Sequence[bytes] | Sequence[memoryview],
    index: int,
    in_shm: ShmParameters | None,
    name: str,
    model_name: str,
) -> int:
    """Triton's checks of where an input's data is, for an input the core will refuse; the
    index of the next raw_input_contents entry."""
    if in_shm is not None:
        return index
    if io.HasField("contents"):
        if raw:
            raise invalid_arg(
                "contents field must not be specified when using raw_input_contents for "
                f"'{name}' for model '{model_name}'"
            )
        return index
    if index < len(raw):
        return index + 1
    raise invalid_arg(
        f"unable to find data for input tensor '{name}' for model '{model_name}' in request."
    )


def _requested_outputs(
    outputs: Any, request: InferRequest, shm: SharedMemoryManager
) -> list[RequestedOutput]:
    """The requested outputs, each once (Triton keeps a set: a name asked twice is answered
    once, classified when either asked for it)."""
    requested: dict[str, RequestedOutput] = {}
    for output in outputs:
        wanted = _requested_output(output, request, shm)
        first = requested.setdefault(wanted.name, wanted)
        if first is not wanted and "classification" in wanted.parameters:
            first.parameters.setdefault("classification", wanted.parameters["classification"])
    return list(requested.values())


def _requested_output(
    output: Any, request: InferRequest, shm: SharedMemoryManager
) -> RequestedOutput:
    if not output.parameters:
        return RequestedOutput(output.name, {})
    parameters, in_shm = _tensor_parameters(output.parameters, output.name)
    classification = output.parameters.get("classification")
    if classification is not None:
        if classification.WhichOneof("parameter_choice") != "int64_param":
            raise invalid_arg(
                "invalid value type for 'classification' parameter, expected int64_param"
            )
        if classification.int64_param <= 0:  # Triton's words for 0 too
            raise invalid_arg("invalid value for 'classification' parameter, expected >= 0")
    if in_shm is None:
        return RequestedOutput(output.name, parameters)
    if "classification" in parameters:
        raise invalid_arg("output can't set both 'shared_memory_region' and 'classification'")
    if request.shm_regions is None:
        request.shm_regions = []
    target = shm.output_target(*in_shm, request.shm_regions)
    return RequestedOutput(output.name, parameters, target)


def decode(data: bytes, shm: SharedMemoryManager = NO_REGIONS) -> InferRequest:
    message, raw = parse_infer_request(data)
    return decode_infer_request(message, raw, shm)
