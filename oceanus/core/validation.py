"""Checks of an inference request against its model's config, with Triton's error texts.

The frontends hand the core flat numpy arrays with the shape the client declared; here the names,
datatypes, shapes, batch size and element counts are checked once for every protocol, and the
arrays get their final shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.core import datatypes
from oceanus.core.datatypes import DataType
from oceanus.core.errors import InferenceServerError, invalid_arg
from oceanus.core.types import InferRequest


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """A config input or output, resolved once at load."""

    name: str
    datatype: DataType
    dims: tuple[int, ...]  # as in the config, without the batch dimension
    optional: bool = False
    reshape: tuple[int, ...] | None = None

    @classmethod
    def from_config(cls, tensor: mc.ModelInput | mc.ModelOutput) -> TensorSpec:
        datatype = datatypes.from_config_name(mc.DataType.Name(tensor.data_type))
        if datatype is None:
            raise invalid_arg(f"unsupported datatype for tensor '{tensor.name}'")
        reshape = tuple(tensor.reshape.shape) if tensor.HasField("reshape") else None
        return cls(
            name=tensor.name,
            datatype=datatype,
            dims=tuple(tensor.dims),
            optional=bool(getattr(tensor, "optional", False)),
            reshape=reshape,
        )


def _request_prefix(request: InferRequest) -> str:
    return f"[request id: {request.id or '<id_unknown>'}] "


def _shape_text(shape: tuple[int, ...] | list[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def validate_request(
    request: InferRequest,
    model_name: str,
    max_batch_size: int,
    inputs: dict[str, TensorSpec],
    outputs: dict[str, TensorSpec],
) -> tuple[dict[str, np.ndarray], int]:
    """Validated input arrays in their final shapes, and the request's batch size (rows)."""
    prefix = _request_prefix(request)
    given: dict[str, np.ndarray] = {}
    batch_size = 0
    if max_batch_size > 0:
        # Triton checks the batch size (each input's first dimension) before anything else.
        for tensor in request.inputs:
            if tensor.shape and tensor.shape[0] > max_batch_size:
                raise invalid_arg(
                    f"{prefix}inference request batch-size must be <= {max_batch_size} for "
                    f"'{model_name}'"
                )
    for tensor in request.inputs:
        spec = inputs.get(tensor.name)
        if spec is None:
            raise invalid_arg(
                f"unexpected inference input '{tensor.name}' for model '{model_name}'"
            )
        if tensor.name in given:
            raise invalid_arg(
                f"{prefix}input '{tensor.name}' already exists in request for model '{model_name}'"
            )
        if tensor.datatype != spec.datatype.name:
            raise invalid_arg(
                f"{prefix}inference input '{tensor.name}' data-type is '{tensor.datatype}', but "
                f"model '{model_name}' expects '{spec.datatype.name}'"
            )
        shape = tensor.shape
        if max_batch_size > 0:
            if not shape:
                raise _shape_error(prefix, tensor.name, model_name, spec, shape, batched=True)
            rows = shape[0]
            if batch_size and rows != batch_size:
                raise invalid_arg(
                    f"{prefix}input '{tensor.name}' batch size does not match other inputs "
                    f"for '{model_name}'"
                )
            batch_size = rows
            if rows > max_batch_size:
                raise invalid_arg(
                    f"{prefix}inference request batch-size must be <= {max_batch_size} for "
                    f"'{model_name}'"
                )
            item_shape = shape[1:]
        else:
            item_shape = shape
        if not _dims_match(item_shape, spec.dims):
            raise _shape_error(prefix, tensor.name, model_name, spec, shape, max_batch_size > 0)
        if max_batch_size > 0 and not shape[0]:
            # Triton sizes a batch of 0 as a batch of 1, so the request's bytes (none) never
            # match: the same "byte size mismatch" answer (checked against Triton 2.51).
            _shaped(prefix, tensor.name, model_name, tensor.data, (1, *item_shape), spec)
        given[tensor.name] = _shaped(prefix, tensor.name, model_name, tensor.data, shape, spec)
    missing = [name for name, spec in inputs.items() if name not in given and not spec.optional]
    if missing:
        raise invalid_arg(
            f"{prefix}expected {len(inputs)} inputs but got {len(given)} inputs for model "
            f"'{model_name}'. Got input(s) {_names(given)}, but missing required input(s) "
            f"{_names(missing)}. Please provide all required input(s)."
        )
    if request.outputs is not None:
        for output in request.outputs:
            if output.name not in outputs:
                raise invalid_arg(
                    f"unexpected inference output '{output.name}' for model '{model_name}'"
                )
    return given, batch_size if max_batch_size > 0 else 1


def _names(names: object) -> str:
    return "[" + ", ".join(f"'{n}'" for n in names) + "]"  # type: ignore[attr-defined]


def _dims_match(shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    if shape == dims:
        return True
    if len(shape) != len(dims):
        return False
    return all(d == -1 or s == d for s, d in zip(shape, dims, strict=True))


def _shape_error(
    prefix: str,
    name: str,
    model_name: str,
    spec: TensorSpec,
    shape: tuple[int, ...],
    batched: bool,
) -> InferenceServerError:
    expected = ((-1,) if batched else ()) + spec.dims
    message = (
        f"{prefix}unexpected shape for input '{name}' for model '{model_name}'. "
        f"Expected {_shape_text(expected)}, got {_shape_text(shape)}. "
    )
    if batched:
        message += (
            "NOTE: Setting a non-zero max_batch_size in the model config requires a batch "
            "dimension to be prepended to each input shape. If you want to specify the full "
            "shape including the batch dim in your input dims config, try setting "
            "max_batch_size to zero. See the model configuration docs for more info on "
            "max_batch_size."
        )
    return invalid_arg(message)  # Triton keeps the trailing space when there is no NOTE


def _shaped(
    prefix: str,
    name: str,
    model_name: str,
    data: np.ndarray,
    shape: tuple[int, ...],
    spec: TensorSpec,
) -> np.ndarray:
    expected = 1
    for dim in shape:
        expected *= dim
    if data.size != expected:
        if spec.datatype.is_bytes:
            raise invalid_arg(
                f"{prefix}expected {expected} string elements for inference input '{name}' "
                f"for model '{model_name}', got {data.size}"
            )
        itemsize = spec.datatype.itemsize
        raise invalid_arg(
            f"{prefix}input byte size mismatch for input '{name}' for model '{model_name}'. "
            f"Expected {expected * itemsize}, got {data.size * itemsize}"
        )
    if data.shape != shape:
        data = data.reshape(shape)
    return data
