"""Triton's generate extension: `POST /v2/models/<m>[/versions/<v>]/generate[_stream]`.

A flat JSON object instead of tensors, as Triton 2.51 maps it (recorded from the reference server,
docs/triton-reference-behaviour.md section 13): a key naming a model input becomes that tensor
(a scalar or a list, shaped from the model's metadata shape, -1 dims taking what is left); any
other key becomes a request parameter (string, number or boolean); the members of
`"parameters"` are mapped the same way; `"id"` is the request id. A response is one object: `id`
(if any), `model_name`, `model_version`, the response's parameters and each output (a lone
element as a scalar, else a flat list; BYTES as text), keys in byte order as Triton writes them.
"""

from __future__ import annotations

from typing import Any

import orjson

from oceanus.core import datatypes
from oceanus.core.errors import InferenceServerError, invalid_arg
from oceanus.core.types import InferRequest, InferResponse, Tensor
from oceanus.frontends.http.codec import array_to_json, json_to_array, parse_json

ONE_RESPONSE_ONLY = (
    "generate expects model to produce exactly 1 response, use generate stream for model that "
    "generates various number of responses"
)
PARAMETERS = "parameters"


def decode_generate_request(
    body: bytes, model_name: str, version: str, inputs: list[dict[str, Any]]
) -> InferRequest:
    """The core request for a generate body; `inputs` is the model metadata's input list."""
    document = parse_json(body) if body.strip() else {}
    if not isinstance(document, dict):
        raise invalid_arg("generate request must be a JSON object")
    request_id = document.get("id", "")
    if not isinstance(request_id, str):
        raise invalid_arg("Unable to parse 'id': attempt to access JSON non-string as string")
    request = InferRequest(model_name, version, id=request_id)
    specs = {spec["name"]: spec for spec in inputs}
    for key, value in document.items():
        if key == "id":
            continue
        if key == PARAMETERS:
            if PARAMETERS in specs:
                raise invalid_arg(
                    "Keyword 'parameters' for nested schema also given as input tensor name"
                )
            if not isinstance(value, dict):
                raise invalid_arg("Expected JSON object for keyword: 'parameters'")
            for inner_key, inner_value in value.items():
                try:
                    _map(inner_key, inner_value, specs, request)
                except InferenceServerError as exc:
                    raise InferenceServerError(
                        exc.code, f"Converting keyword: 'parameters': {exc.message}"
                    ) from None
            continue
        _map(key, value, specs, request)
    return request


def _map(key: str, value: Any, specs: dict[str, dict[str, Any]], request: InferRequest) -> None:
    spec = specs.get(key)
    if spec is None:
        if isinstance(value, (bool, int, float, str)):
            request.parameters[key] = value
            return
        raise invalid_arg(
            f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'."
        )
    if any(tensor.name == key for tensor in request.inputs):
        raise invalid_arg(
            f"[request id: {request.id or '<id_unknown>'}] input '{key}' already exists in request"
        )
    datatype = datatypes.from_name(spec["datatype"])
    if datatype is None:
        raise invalid_arg(f"input '{key}' has unsupported datatype {spec['datatype']}")
    if datatype.name in ("FP16", "BF16"):
        raise invalid_arg(
            f"receiving {datatype.name} data via JSON is not supported. Please use the binary "
            f"data format for input {key}"
        )
    data = json_to_array(datatype, value if isinstance(value, list) else [value])
    shape = _shape(key, spec["shape"], data.size)
    request.inputs.append(Tensor(key, datatype.name, shape, data.reshape(shape)))


def _shape(name: str, dims: list[int], count: int) -> tuple[int, ...]:
    """The model's shape for `count` elements: fixed dims must divide it, the last -1 dim takes
    what is left and other -1 dims are 1 (Triton's rule)."""
    shape = list(dims)
    left = count
    for dim in reversed(shape):
        if dim != -1:
            if dim == 0 or left % dim:
                raise invalid_arg(
                    f"The schema can not convert input '{name}' to tensor with proper shape"
                )
            left //= dim
    for index in range(len(shape) - 1, -1, -1):
        if shape[index] == -1:
            shape[index] = left
            left = 1
    if left != 1:
        raise invalid_arg(f"The schema can not convert input '{name}' to tensor with proper shape")
    return tuple(shape)


def generate_document(response: InferResponse) -> dict[str, Any]:
    """The generate response object for one inference response."""
    document: dict[str, Any] = {"model_name": response.model_name}
    document["model_version"] = response.model_version
    if response.id:
        document["id"] = response.id
    for key, value in response.parameters.items():
        if key != "triton_final_response":
            document[key] = value
    for tensor in response.outputs:
        values = array_to_json(tensor.data, tensor.datatype)
        document[tensor.name] = values[0] if len(values) == 1 else values
    return {key: document[key] for key in sorted(document, key=lambda k: k.encode())}


def server_sent_event(document: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(document) + b"\n\n"
