"""Small helpers the framework backends share: config parameters and Triton's shape-check text."""

from __future__ import annotations

from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from oceanus.core.errors import invalid_arg
from oceanus.core.repository.load_hints import shape_hint

_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def parameter(config: mc.ModelConfig, key: str) -> str | None:
    """The config's `parameters { key: ... value: { string_value: ... } }`, or None."""
    if key in config.parameters:
        return str(config.parameters[key].string_value)
    return None


def bool_parameter(config: mc.ModelConfig, key: str, default: bool) -> bool:
    """A boolean parameter as Triton's backends parse it ("true"/"false", "yes"/"no", "1"/"0")."""
    value = parameter(config, key)
    if value is None or value.strip() == "":
        return default
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise invalid_arg(
        f"unable to load model '{config.name}': failed to convert parameter '{key}' value "
        f"'{value}' to a boolean value"
    )


def optional_bool_parameter(config: mc.ModelConfig, key: str) -> bool | None:
    """A boolean parameter that changes nothing unless the config sets it."""
    if parameter(config, key) is None:
        return None
    return bool_parameter(config, key, False)


def int_parameter(config: mc.ModelConfig, key: str, minimum: int = 0) -> int | None:
    value = parameter(config, key)
    if value is None or value.strip() == "":
        return None
    try:
        number = int(value.strip())
    except ValueError:
        number = minimum - 1
    if number < minimum:
        raise invalid_arg(
            f"unable to load model '{config.name}': expected the parameter '{key}' to be an "
            f"integer >= {minimum}, got {value}"
        )
    return number


def config_dims(tensor: Any) -> list[int]:
    """The dims a backend checks: the reshape's shape when the config has one."""
    return list(tensor.reshape.shape) if tensor.HasField("reshape") else list(tensor.dims)


def _matches(dims: list[int], model_dims: list[int]) -> bool:
    """Config dims equal to the model's full shape (-1 matching anything)."""
    return len(dims) == len(model_dims) and all(
        d == -1 or m == -1 or d == m for d, m in zip(dims, model_dims, strict=True)
    )


def check_dims(config: mc.ModelConfig, kind: str, tensor: Any, model_dims: list[int]) -> None:
    """Triton's shape check of a config tensor against the model's shape (-1: any size)."""
    dims = config_dims(tensor)
    batched = config.max_batch_size > 0
    full = ([-1] if batched else []) + dims
    shape_text = f"[{','.join(str(d) for d in model_dims)}]"
    if batched and (not model_dims or model_dims[0] != -1):
        raise invalid_arg(
            f"model '{config.name}', tensor '{tensor.name}': for the model to support "
            f"batching the shape should have at least 1 dimension and the first dimension "
            f"must be -1; but shape expected by the model is {shape_text}"
        )
    if len(full) != len(model_dims) or any(
        m != -1 and c != -1 and m != c for m, c in zip(model_dims, full, strict=False)
    ):
        if batched and _matches(dims, model_dims):
            # The most common config mistake: dims written with the batch dimension.
            corrected = ", ".join(str(d) for d in dims[1:])
            raise invalid_arg(
                f"model '{config.name}', {kind} '{tensor.name}': dims "
                f"[{','.join(str(d) for d in dims)}] include the batch dimension, but "
                f"max_batch_size > 0 already adds it in front; write 'dims: [ {corrected} ]'"
                " (or set max_batch_size: 0 to give the full shape)"
            )
        if batched:
            explain = (
                f"{len(full)} dimensions (an initial batch dimension because max_batch_size "
                f"> 0 followed by the explicit tensor shape, making complete shape "
                f"[{','.join(str(d) for d in full)}])"
            )
        else:
            explain = f"{len(full)} dimensions (shape [{','.join(str(d) for d in full)}])"
        raise invalid_arg(
            f"model '{config.name}', tensor '{tensor.name}': the model expects "
            f"{len(model_dims)} dimensions (shape {shape_text}) but the model configuration "
            f"specifies {explain}",
            hint=shape_hint(tensor.name, model_dims, full, batched),
        )


def total_instances(config: mc.ModelConfig) -> int:
    return sum(max(1, group.count) for group in config.instance_group) or 1
