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
from oceanus.core.types import InferRequest, InferResponse, RequestedOutput, Tensor

HEADER_LENGTH = "inference-header-content-length"


def parse_json(data: bytes | memoryview, what: str = "request") -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise invalid_arg(f"failed to parse the {what} JSON buffer: {exc.msg} at {exc.pos}") from None


def decode_infer_request(
    body: bytes, header_length: str | None, model_name: str, model_version: str
) -> InferRequest:
    """Build a core request from an `/infer` body (JSON, or JSON header + binary tensors)."""
    view = memoryview(body)
    if header_length is not None:
        try:
            json_size = int(header_length)
        except ValueError:
            raise invalid_arg(
                f"Unable to parse Inference-Header-Content-Length: '{header_length}'"
            ) from None
        if json_size < 0 or json_size > len(body):
            raise invalid_arg(
                f"Inference-Header-Content-Length {json_size} exceeds the request body size "
                f"{len(body)}"
            )
        document = parse_json(view[:json_size])
        binary = view[json_size:]
    else:
        document = parse_json(body)
        binary = view[len(body) :]
    if not isinstance(document, dict):
        raise invalid_arg("failed to parse the request JSON buffer: expected a JSON object")
    request = InferRequest(model_name=model_name, model_version=model_version)
    request_id = document.get("id")
    if request_id is not None:
        request.id = str(request_id)
    parameters = document.get("parameters")
    if parameters is not None:
        if not isinstance(parameters, dict):
            raise invalid_arg("'parameters' must be a JSON object")
        request.parameters = parameters
    inputs = document.get("inputs")
    if not isinstance(inputs, list):
        raise invalid_arg("Unable to find 'inputs' in the request JSON")
    offset = 0
    for item in inputs:
        tensor, offset = _decode_input(item, binary, offset)
        request.inputs.append(tensor)
    if offset != len(binary):
        raise invalid_arg(
            f"unexpected additional input data for model '{model_name}': the request holds "
            f"{len(binary)} bytes of binary data but its inputs use {offset}"
        )
    outputs = document.get("outputs")
    if outputs is not None:
        if not isinstance(outputs, list):
            raise invalid_arg("'outputs' must be a JSON array")
        request.outputs = [_decode_output(item) for item in outputs]
    return request


def _decode_output(item: Any) -> RequestedOutput:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise invalid_arg("each requested output must be a JSON object with a 'name'")
    parameters = item.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise invalid_arg(f"'parameters' of output '{item['name']}' must be a JSON object")
    return RequestedOutput(item["name"], parameters)


def _decode_input(item: Any, binary: memoryview, offset: int) -> tuple[Tensor, int]:
    if not isinstance(item, dict):
        raise invalid_arg("each input must be a JSON object")
    name = item.get("name")
    if not isinstance(name, str):
        raise invalid_arg("Unable to find 'name' of an input in the request JSON")
    datatype_name = item.get("datatype")
    if not isinstance(datatype_name, str):
        raise invalid_arg(f"Unable to find 'datatype' for input '{name}'")
    shape_value = item.get("shape")
    if not isinstance(shape_value, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape_value
    ):
        raise invalid_arg(f"Unable to parse 'shape' for input '{name}'")
    shape = tuple(shape_value)
    datatype = datatypes.from_name(datatype_name)
    if datatype is None:
        raise invalid_arg(f"invalid datatype '{datatype_name}' for input '{name}'")
    parameters = item.get("parameters") or {}
    binary_size = parameters.get("binary_data_size") if isinstance(parameters, dict) else None
    if binary_size is not None:
        if not isinstance(binary_size, int) or binary_size < 0:
            raise invalid_arg(f"Unable to parse 'binary_data_size' for input '{name}'")
        end = offset + binary_size
        if end > len(binary):
            raise invalid_arg(
                f"unexpected size for input '{name}', expecting {binary_size} bytes but the "
                f"request holds only {len(binary) - offset} more bytes of binary data"
            )
        data = _from_binary(name, datatype, binary[offset:end])
        return Tensor(name, datatype_name, shape, data), end
    if "data" not in item:
        raise invalid_arg(f"input '{name}' has neither 'data' nor 'binary_data_size' parameter")
    return Tensor(name, datatype_name, shape, _from_json(name, datatype, item["data"])), offset


def _from_binary(name: str, datatype: DataType, chunk: memoryview) -> np.ndarray:
    if datatype.is_bytes:
        items = datatypes.deserialize_bytes(chunk)
        if items is None:
            raise invalid_arg(
                f"unexpected BYTES framing for input '{name}': each element needs a 4-byte "
                "length followed by that many bytes"
            )
        array = np.empty(len(items), dtype=object)
        array[:] = items
        return array
    if len(chunk) % datatype.itemsize:
        raise invalid_arg(
            f"input '{name}' holds {len(chunk)} bytes, not a whole number of "
            f"{datatype.name} elements of {datatype.itemsize} bytes"
        )
    return np.frombuffer(chunk, dtype=datatype.dtype)


def _flatten(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    if data and isinstance(data[0], list):
        flat: list[Any] = []
        for item in data:
            flat.extend(_flatten(item))
        return flat
    return data


def _from_json(name: str, datatype: DataType, data: Any) -> np.ndarray:
    flat = _flatten(data)
    if datatype.is_bytes:
        array = np.empty(len(flat), dtype=object)
        try:
            array[:] = [s.encode() if isinstance(s, str) else _reject(name, datatype) for s in flat]
        except InferenceServerError:
            raise
        return array
    if datatype.name in ("FP16", "BF16"):
        raise invalid_arg(
            f"datatype {datatype.name} of input '{name}' is only supported in binary form "
            "(binary_data_size); JSON cannot carry it"
        )
    if datatype.name == "BOOL":
        if not all(isinstance(v, bool) for v in flat):
            _reject(name, datatype)
        return np.array(flat, dtype=np.bool_)
    is_float = datatype.dtype.kind == "f"
    for value in flat:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            _reject(name, datatype)
        if not is_float and isinstance(value, float):
            _reject(name, datatype)
    try:
        return np.array(flat, dtype=datatype.dtype)
    except (OverflowError, ValueError):
        _reject(name, datatype)
        raise  # unreachable; keeps type checkers calm


def _reject(name: str, datatype: DataType) -> Any:
    raise invalid_arg(
        f"Unable to parse 'data': the values of input '{name}' must all be of type "
        f"{datatype.name}"
    )


def _json_data(array: np.ndarray, datatype: str) -> Any:
    flat = array.reshape(-1)
    if datatype == "BYTES":
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in flat]
    if datatype in ("FP16", "BF16"):
        return flat.astype(np.float32).tolist()
    return flat.tolist()


def _binary_bytes(array: np.ndarray, datatype: str) -> bytes | memoryview:
    if datatype == "BYTES":
        return datatypes.serialize_bytes(array)
    # a uint8 view works for every dtype, bfloat16 included (memoryview cannot format it)
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data


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
            if wanted is not None and "binary_data" in wanted.parameters:
                binary = bool(wanted.parameters["binary_data"])
        if binary:
            chunk = _binary_bytes(tensor.data, tensor.datatype)
            entry["parameters"] = {"binary_data_size": len(chunk)}
            chunks.append(chunk)
        else:
            entry["data"] = _json_data(tensor.data, tensor.datatype)
        outputs_json.append(entry)
    document: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        document["id"] = response.id
    if response.parameters:
        document["parameters"] = response.parameters
    document["outputs"] = outputs_json
    header = orjson.dumps(document)
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)
