"""Building gRPC infer requests as the Triton-reference tests send them (conftest.py puts
this folder on sys.path); Triton 2.51's answers: docs/triton-reference-behaviour.md."""

from __future__ import annotations

from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2 as pb

ROW = np.arange(16, dtype=np.int32).reshape(1, 16).tobytes()
SCORES = (0.1, 0.7, 0.2, 0.7, -1.0)
INVALID = "INVALID_ARGUMENT"


def set_parameter(parameter: Any, value: Any) -> None:
    if isinstance(value, tuple):  # (field, value): a type the plain Python value does not say
        setattr(parameter, value[0], value[1])
    elif isinstance(value, bool):
        parameter.bool_param = value
    elif isinstance(value, int):
        parameter.int64_param = value
    elif isinstance(value, float):
        parameter.double_param = value
    else:
        parameter.string_param = value


def request(
    model: str = "simple",
    inputs: list[dict[str, Any]] | None = None,
    raw: list[bytes] | None = None,
    outputs: tuple[tuple[str, dict[str, Any]], ...] = (),
    params: dict[str, Any] | None = None,
    version: str = "",
    rid: str = "v1",
) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name=model, model_version=version, id=rid)
    for spec in inputs if inputs is not None else [{"name": "INPUT0"}, {"name": "INPUT1"}]:
        tensor = message.inputs.add(name=spec["name"], datatype=spec.get("datatype", "INT32"))
        tensor.shape.extend(spec.get("shape", [1, 16]))
        for field, values in spec.get("contents", {}).items():
            getattr(tensor.contents, field).extend(values)
        for key, value in spec.get("params", {}).items():
            set_parameter(tensor.parameters[key], value)
    message.raw_input_contents.extend(raw if raw is not None else [ROW, ROW])
    for name, parameters in outputs:
        output = message.outputs.add(name=name)
        for key, value in parameters.items():
            set_parameter(output.parameters[key], value)
    for key, value in (params or {}).items():
        set_parameter(message.parameters[key], value)
    return message


def scores(
    model: str = "scores",
    rows: tuple[tuple[float, ...], ...] = (SCORES,),
    outputs: tuple[tuple[str, dict[str, Any]], ...] = (),
    input_name: str = "INPUT0",
) -> pb.ModelInferRequest:
    array = np.array(rows, dtype=np.float32)
    tensor = {"name": input_name, "datatype": "FP32", "shape": list(array.shape)}
    return request(model, [tensor], [array.tobytes()], outputs, rid="c1")


def cls(k: Any) -> dict[str, Any]:
    return {"classification": k}
