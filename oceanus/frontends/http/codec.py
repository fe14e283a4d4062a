"""KServe v2 JSON and Triton's binary tensor extension <-> core requests and responses.

Binary tensors are sliced out of the body with `numpy.frombuffer` over a memoryview (no copy);
only the JSON header is parsed, with orjson.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from oceanus.core import datatypes
from oceanus.core.datatypes import DataType
from oceanus.core.errors import InferenceServerError, invalid_arg
from oceanus.core.shared_memory import NO_REGIONS, SharedMemoryManager
from oceanus.core.tensor_bytes import array_from_bytes, array_to_bytes, check_bytes_count
from oceanus.core.types import InferRequest, InferResponse, RequestedOutput, Tensor

HEADER_LENGTH = "inference-header-content-length"


def parse_json(data: bytes | memoryview, what: str = "request") -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise invalid_arg(
            f"failed to parse the {what} JSON buffer: {exc.msg} at {exc.pos}"
        ) from None


def _member(document: dict[str, Any], key: str) -> Any:
    if key not in document:
        raise invalid_arg(
            f"Unable to parse '{key}': attempt to access non-existing object member '{key}'"
        )
    return document[key]


def decode_infer_request(
    body: bytes,
    header_length: str | None,
    model_name: str,
    model_version: str,
    shm: SharedMemoryManager = NO_REGIONS,
) -> InferRequest:
    """Build a core request from an `/infer` body (JSON, or JSON header + binary tensors).

    Tensors may name regions of `shm` (the system shared memory extension) instead of carrying
    data.

    Error texts are Triton's; where Triton answers a client's mistake with 500, the core's
    INVALID_ARG makes it a 400 with the same words.
    """
    view = memoryview(body)
    json_size = len(body)
    if header_length is not None:
        try:
            json_size = int(header_length)
        except ValueError:
            raise invalid_arg(
                f"Unable to parse Inference-Header-Content-Length: '{header_length}'"
            ) from None
        if json_size < 0 or json_size > len(body):
            raise invalid_arg(
                f"inference header size should be in range (0, {len(body)}), got: {json_size}"
            )
    document = parse_json(view[:json_size])
    binary = view[json_size:]
    if not isinstance(document, dict):
        raise invalid_arg(
            "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"
        )
    request = InferRequest(model_name=model_name, model_version=model_version)
    request_id = document.get("id")
    if request_id is not None:
        if not isinstance(request_id, str):
            raise invalid_arg("Unable to parse 'id': attempt to access JSON non-string as string")
        request.id = request_id
    parameters = document.get("parameters")
    if parameters is not None:
        request.parameters = _parameters(parameters)
    inputs = _member(document, "inputs")
    if not isinstance(inputs, list):
        raise invalid_arg("Unable to parse 'inputs': attempt to access JSON non-array as array")
    offset = 0
    for item in inputs:
        tensor, offset = _decode_input(item, binary, offset, request, shm)
        request.inputs.append(tensor)
    if offset != len(binary):
        raise invalid_arg(f"unexpected additional input data for model '{model_name}'")
    outputs = document.get("outputs")
    if outputs is not None:
        if not isinstance(outputs, list):
            raise invalid_arg(
                "Unable to parse 'outputs': attempt to access JSON non-array as array"
            )
        seen: dict[str, RequestedOutput] = {}
        for item in outputs:
            output = _decode_output(item, request, shm)
            seen.setdefault(output.name, output)  # duplicates collapse, as in Triton
        request.outputs = list(seen.values())
    return request


_UNSIGNED = ("priority", "timeout")
_BOOLEAN = ("sequence_start", "sequence_end", "binary_data_output")
RESERVED_PREFIX_ERROR = (
    "parameter keys starting with 'triton_' are reserved for Triton usage and should not be "
    "specified."
)


def _parameters(parameters: Any) -> dict[str, Any]:
    """Request parameters checked in order, as Triton's ParseJsonTritonParams checks them: its
    own keys by type, then any other `triton_` key refused, then the rest by type."""
    if not isinstance(parameters, dict):
        raise invalid_arg("failed to get request params.: attempt to get members for non-object")
    for key, value in parameters.items():
        if key == "sequence_id":
            if not _is_unsigned(value) and not isinstance(value, str):
                raise invalid_arg(
                    "Unable to parse 'sequence_id': attempt to access JSON non-string as string"
                )
        elif key in _UNSIGNED:
            if not _is_unsigned(value):
                raise invalid_arg(
                    f"Unable to parse '{key}': attempt to access JSON non-unsigned-integer as "
                    "unsigned-integer"
                )
        elif key in _BOOLEAN:
            if not isinstance(value, bool):
                raise invalid_arg(
                    f"Unable to parse '{key}': attempt to access JSON non-boolean as boolean"
                )
        elif key.startswith("triton_"):
            raise invalid_arg(RESERVED_PREFIX_ERROR)
        elif isinstance(value, (list, dict)) or value is None:
            raise invalid_arg(
                f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or "
                "'string'."
            )
    return parameters


def _is_unsigned(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


_SHM_KEYS = frozenset(("shared_memory_region", "shared_memory_offset", "shared_memory_byte_size"))


def _shm_parameters(parameters: dict[str, Any]) -> tuple[str | None, int, int]:
    """(region or None, offset, byte size) from a tensor's shared memory parameters."""
    region = parameters.get("shared_memory_region")
    if "shared_memory_region" in parameters and not isinstance(region, str):
        raise invalid_arg(
            "Unable to parse 'shared_memory_region': attempt to access JSON non-string as string"
        )
    values = [0, 0]
    for index, key in enumerate(("shared_memory_offset", "shared_memory_byte_size")):
        value = parameters.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise invalid_arg(
                f"Unable to parse '{key}': attempt to access JSON non-unsigned-integer as "
                "unsigned-integer"
            )
        values[index] = value
    return region, values[0], values[1]


def _check_shm_output(parameters: dict[str, Any]) -> None:
    """Triton's refusals of what an output in shared memory cannot also be."""
    if "classification" in parameters:
        raise invalid_arg("Output can't set both 'shared_memory_region' and 'classification'")
    binary = parameters.get("binary_data")
    if binary is not None:
        if not isinstance(binary, bool):
            raise invalid_arg(
                "Unable to set 'binary_data': attempt to access JSON non-boolean as boolean"
            )
        if binary:
            raise invalid_arg("Output can't set both 'shared_memory_region' and 'binary_data'")


def _class_count(parameters: dict[str, Any]) -> dict[str, Any]:
    """An output's parameters with `classification` checked as Triton's HTTP frontend reads it
    (an unsigned integer; 0 asks for the tensor itself). Triton answers 500; we, 400."""
    count = parameters.get("classification")
    if count is None:
        return parameters
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise invalid_arg(
            "Unable to set 'classification': attempt to access JSON non-unsigned-integer as "
            "unsigned-integer"
        )
    if count == 0:
        return {k: v for k, v in parameters.items() if k != "classification"}
    return parameters


def _decode_output(
    item: Any, request: InferRequest, shm: SharedMemoryManager = NO_REGIONS
) -> RequestedOutput:
    if not isinstance(item, dict):
        raise invalid_arg(
            "Unable to parse 'name': attempt to access non-existing object member 'name'"
        )
    name = _member(item, "name")
    if not isinstance(name, str):
        raise invalid_arg("Unable to parse 'name': attempt to access JSON non-string as string")
    parameters = item.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise invalid_arg("failed to get request params.: attempt to get members for non-object")
    if _SHM_KEYS.isdisjoint(parameters):
        return RequestedOutput(name, _class_count(parameters))
    if "shared_memory_region" in parameters:
        _check_shm_output(parameters)
    region, shm_offset, shm_size = _shm_parameters(parameters)
    if region is None:
        return RequestedOutput(name, _class_count(parameters))
    if request.shm_regions is None:
        request.shm_regions = []
    target = shm.output_target(region, shm_offset, shm_size, request.shm_regions)
    return RequestedOutput(name, parameters, target)


def _decode_input(
    item: Any,
    binary: memoryview,
    offset: int,
    request: InferRequest,
    shm: SharedMemoryManager = NO_REGIONS,
) -> tuple[Tensor, int]:
    model_name = request.model_name
    if not isinstance(item, dict):
        raise invalid_arg(
            "Unable to parse 'name': attempt to access non-existing object member 'name'"
        )
    name = _member(item, "name")
    if not isinstance(name, str):
        raise invalid_arg("Unable to parse 'name': attempt to access JSON non-string as string")
    shape_value = _member(item, "shape")
    if not isinstance(shape_value, list):
        raise invalid_arg("Unable to parse 'shape': attempt to access JSON non-array as array")
    for dim in shape_value:  # JSON integers are exactly int (a bool is not one here)
        if type(dim) is not int or dim < 0:
            raise invalid_arg(
                "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as "
                "unsigned-integer"
            )
    datatype_name = _member(item, "datatype")
    if not isinstance(datatype_name, str):
        raise invalid_arg("Unable to parse 'datatype': attempt to access JSON non-string as string")
    shape = tuple(shape_value)
    datatype = datatypes.from_name(datatype_name)
    if datatype is None:
        raise invalid_arg(f"invalid datatype for input {name}")
    parameters = item.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise invalid_arg("failed to get request params.: attempt to get members for non-object")
    binary_size = parameters.get("binary_data_size")
    has_data = "data" in item
    has_shm = "shared_memory_region" in parameters
    if has_data + (binary_size is not None) + has_shm != 1:
        given = " ".join(
            f"'{f}'"
            for f, on in (
                ("data", has_data),
                ("binary_data_size", binary_size is not None),
                ("shared_memory_region", has_shm),
            )
            if on
        )
        raise invalid_arg(
            "Input must set only one of the following fields: 'data', 'binary_data_size' in "
            "'parameters', 'shared_memory_region' in 'parameters'. But "
            + (f"set {given}" if given else "no field is set")
        )
    if has_shm or (parameters and binary_size is None):
        region, shm_offset, shm_size = _shm_parameters(parameters)
        if region is not None:
            if request.shm_regions is None:
                request.shm_regions = []
            view = shm.input_view(region, shm_offset, shm_size, request.shm_regions)
            data = array_from_bytes(name, datatype, view, shape, model_name, request.id)
            return Tensor(name, datatype_name, shape, data), offset
    if binary_size is not None:
        if isinstance(binary_size, bool) or not isinstance(binary_size, int) or binary_size < 0:
            raise invalid_arg(
                "Unable to parse 'binary_data_size': attempt to access JSON non-unsigned-integer "
                "as unsigned-integer"
            )
        end = offset + binary_size
        if end > len(binary):
            raise invalid_arg(
                f"unexpected size for input '{name}', expecting {end - len(binary)} additional "
                f"bytes for model '{model_name}'"
            )
        data = array_from_bytes(name, datatype, binary[offset:end], shape, model_name, request.id)
        return Tensor(name, datatype_name, shape, data), end
    if datatype.name in ("FP16", "BF16"):
        raise invalid_arg(
            f"receiving {datatype.name} data via JSON is not supported. Please use the binary "
            f"data format for input {name}"
        )
    expected = 1
    for dim in shape:
        expected *= dim
    if datatype.is_bytes:  # one Python object per element: bounded before any is made
        given = item["data"]
        count = max(expected, len(given) if isinstance(given, list) else 1)
        check_bytes_count(name, count, model_name, request.id)
    data = json_to_array(datatype, item["data"])
    if data.size != expected:
        raise invalid_arg("Unable to parse 'data': Shape does not match true shape of 'data' field")
    return Tensor(name, datatype_name, shape, data), offset


def _flatten(data: Any) -> list[Any]:
    """Nested JSON lists in row-major order, without recursion: a client may nest as deep as
    the JSON parser allows (orjson: 1,024 levels), deeper than Python's stack."""
    if not isinstance(data, list):
        return [data]
    if not data or not isinstance(data[0], list):
        return data
    flat: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list) and item and isinstance(item[0], list):
                stack.append(iter(item))
                break
            if isinstance(item, list):
                flat.extend(item)
            else:
                flat.append(item)
        else:
            stack.pop()
    return flat


_JSON_KIND = {"i": "signed-integer", "u": "unsigned-integer", "f": "double", "b": "boolean"}


def _type_error(datatype: DataType) -> InferenceServerError:
    if datatype.is_bytes:
        return invalid_arg(
            "Unable to parse JSON bytes array: attempt to access JSON non-string as string"
        )
    kind = _JSON_KIND[datatype.dtype.kind]
    return invalid_arg(f"Unable to parse 'data': attempt to access JSON non-{kind} as {kind}")


def json_to_array(datatype: DataType, data: Any) -> np.ndarray:
    flat = _flatten(data)
    if datatype.is_bytes:
        if not all(isinstance(s, str) for s in flat):
            raise _type_error(datatype)
        array = np.empty(len(flat), dtype=object)
        array[:] = [s.encode() for s in flat]
        return array
    kind = datatype.dtype.kind
    if kind == "b":
        valid = all(isinstance(v, bool) for v in flat)
    elif kind == "f":
        valid = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in flat)
    elif kind == "u":
        valid = all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in flat)
    else:
        valid = all(isinstance(v, int) and not isinstance(v, bool) for v in flat)
    if not valid:
        raise _type_error(datatype)
    try:
        return np.array(flat, dtype=datatype.dtype)
    except OverflowError:
        # Triton truncates out-of-range integers silently; refusing them is kinder.
        raise invalid_arg(
            f"Unable to parse 'data': a value is out of range for {datatype.name}"
        ) from None


def array_to_json(array: np.ndarray, datatype: str) -> Any:
    flat = array.reshape(-1)
    if datatype == "BYTES":
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in flat]
    if datatype in ("FP16", "BF16"):
        raise invalid_arg(
            f"sending {datatype} data via JSON is not supported. Please use the binary data "
            "format for output"
        )
    return flat.tolist()


def encode_infer_response(
    response: InferResponse, binary_by_default: bool
) -> tuple[bytes, int | None]:
    """The response body and, when it carries binary tensors, the JSON header's length."""
    outputs_json: list[dict[str, Any]] = []
    chunks: list[bytes | memoryview] = []
    requested = response.requested
    for tensor in response.outputs:
        entry: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.shape),
        }
        binary = binary_by_default
        if requested is not None:
            wanted = requested.get(tensor.name)
            if wanted is not None:
                if wanted.shm is not None:  # written to the client's region: no data here
                    outputs_json.append(entry)
                    continue
                if "binary_data" in wanted.parameters:
                    binary = bool(wanted.parameters["binary_data"])
        if binary:
            chunk = array_to_bytes(tensor.data, tensor.datatype)
            entry["parameters"] = {"binary_data_size": len(chunk)}
            chunks.append(chunk)
        else:
            entry["data"] = array_to_json(tensor.data, tensor.datatype)
        outputs_json.append(entry)
    document: dict[str, Any] = {}
    if response.id:
        document["id"] = response.id
    document["model_name"] = response.model_name
    document["model_version"] = response.model_version
    if response.parameters:
        document["parameters"] = response.parameters
    document["outputs"] = outputs_json
    header = orjson.dumps(document)
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)
