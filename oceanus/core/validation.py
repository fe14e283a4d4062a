"""Checks of an inference request against its model's config, with Triton's error texts.

The frontends hand the core flat numpy arrays with the shape the client declared; here the names,
datatypes, shapes, batch size and element counts are checked once for every protocol, and the
arrays get their final shape.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.core import datatypes
from oceanus.core.datatypes import DataType
from oceanus.core.errors import InferenceServerError, invalid_arg
from oceanus.core.types import InferRequest, Tensor
from oceanus.core.validation_order import unordered_map_order


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


_UINT32 = 0xFFFFFFFF


def validate_request(
    request: InferRequest,
    model_name: str,
    max_batch_size: int,
    inputs: dict[str, TensorSpec],
    outputs: dict[str, TensorSpec],
) -> tuple[dict[str, np.ndarray], int]:
    """Validated input arrays in their final shapes, and the request's batch size (rows).

    The checks run in Triton's order (its InferenceRequest::Normalize): requested outputs, the
    number of inputs, each input's name and batch dimension, the batch size, then each input's
    datatype, shape and size. Triton walks the inputs in its hash map's order, which decides
    which of several bad inputs it names; that order costs a hash per name, so it is only
    worked out when the request is refused."""
    given = request.inputs
    try:  # the common case, a good request: checked once, no error texts built
        arrays, batch_size = _validate(request, model_name, max_batch_size, inputs, outputs, given)
        if len(arrays) == len(given):  # else a name came twice: the exact pass says so
            return arrays, batch_size
    except InferenceServerError:
        pass
    ordered = _triton_order(given) if len(given) > 1 else given
    return _validate(request, model_name, max_batch_size, inputs, outputs, ordered, exact=True)


def checked_inputs(request: InferRequest, max_batch_size: int) -> tuple[dict[str, np.ndarray], int]:
    """validate_request's answer for a request it already accepted (in a frontend worker, for
    the same model version): the arrays in their shapes and the rows, without the checks."""
    arrays: dict[str, np.ndarray] = {}
    batch_size = 0
    for tensor in request.inputs:
        data, shape = tensor.data, tensor.shape
        arrays[tensor.name] = data if data.shape == shape else data.reshape(shape)
        if not batch_size and max_batch_size > 0:  # as _validate takes it
            batch_size = shape[0] & _UINT32
    return arrays, batch_size if max_batch_size > 0 else 1


def _triton_order(tensors: list[Tensor]) -> list[Tensor]:
    by_name = {tensor.name: tensor for tensor in reversed(tensors)}  # the first of a name wins
    return [by_name[name] for name in unordered_map_order(t.name for t in tensors)]


def _validate(
    request: InferRequest,
    model_name: str,
    max_batch_size: int,
    inputs: dict[str, TensorSpec],
    outputs: dict[str, TensorSpec],
    ordered: list[Tensor],
    exact: bool = False,
) -> tuple[dict[str, np.ndarray], int]:
    """The checks; only an `exact` pass (inputs in Triton's order) looks for repeated names and
    words its errors with the request's id: a first pass's error is never shown."""
    prefix = ""
    if exact:
        prefix = _request_prefix(request)
        names: set[str] = set()
        for tensor in request.inputs:  # Triton refuses a repeated name as the frontend adds it
            if tensor.name in names:
                raise invalid_arg(f"{prefix}input '{tensor.name}' already exists in request")
            names.add(tensor.name)
    if request.outputs is not None:
        for output in request.outputs:
            if output.name not in outputs:
                raise invalid_arg(
                    f"unexpected inference output '{output.name}' for model '{model_name}'"
                )
    _check_count(request, prefix, model_name, inputs)
    batched = max_batch_size > 0
    batch_size = 0
    for tensor in ordered:
        if tensor.name not in inputs:
            raise invalid_arg(
                f"unexpected inference input '{tensor.name}' for model '{model_name}'"
            )
        if batched:
            shape = tensor.shape
            if not shape:
                raise invalid_arg(
                    f"{prefix}input '{tensor.name}' has no shape but model requires batch "
                    f"dimension for '{model_name}'"
                )
            if not batch_size:
                # Triton keeps the batch size in a uint32: a negative or huge first dimension
                # then matches no input's, its own included (as in Triton 2.51)
                batch_size = shape[0] & _UINT32
            elif shape[0] != batch_size:
                raise invalid_arg(
                    f"{prefix}input '{tensor.name}' batch size does not match other inputs "
                    f"for '{model_name}'"
                )
    if batch_size > max_batch_size and batched:
        raise invalid_arg(
            f"{prefix}inference request batch-size must be <= {max_batch_size} for '{model_name}'"
        )
    arrays: dict[str, np.ndarray] = {}
    for tensor in ordered:
        spec = inputs[tensor.name]
        if tensor.datatype != spec.datatype.name:
            raise invalid_arg(
                f"{prefix}inference input '{tensor.name}' data-type is '{tensor.datatype}', but "
                f"model '{model_name}' expects '{spec.datatype.name}'"
            )
        shape = tensor.shape
        item_shape = shape[1:] if batched else shape
        if not _dims_match(item_shape, spec.dims):
            raise _shape_error(prefix, tensor.name, model_name, spec, shape, batched)
        if batched and not shape[0]:
            # Triton sizes a batch of 0 as a batch of 1, so the request's bytes (none) never
            # match: the same "byte size mismatch" answer (checked against Triton 2.51).
            _shaped(prefix, tensor.name, model_name, tensor.data, (1, *item_shape), spec)
        arrays[tensor.name] = _shaped(prefix, tensor.name, model_name, tensor.data, shape, spec)
    if ordered is not request.inputs:  # back in the request's order
        arrays = {tensor.name: arrays[tensor.name] for tensor in request.inputs}
    return arrays, batch_size if batched else 1


def _check_count(
    request: InferRequest, prefix: str, model_name: str, inputs: dict[str, TensorSpec]
) -> None:
    """Triton's ValidateRequestInputs: between the required and the declared number of inputs,
    whatever their names."""
    count = len(request.inputs)
    if count == len(inputs):  # every input given (names are checked next)
        return
    required = sum(1 for spec in inputs.values() if not spec.optional)
    if required <= count <= len(inputs):
        return
    given = {tensor.name for tensor in request.inputs}
    missing = [name for name, spec in inputs.items() if not spec.optional and name not in given]
    got = _names(unordered_map_order(tensor.name for tensor in request.inputs))
    # Triton drops the last character of "['a'," to close the list, so an empty list of
    # missing inputs prints as "]".
    missing_text = _names(missing) if missing else "]"
    if required == len(inputs):
        expected = f"expected {len(inputs)} inputs"
    else:
        expected = f"expected number of inputs between {required} and {len(inputs)}"
    raise invalid_arg(
        f"{prefix}{expected} but got {count} inputs for model '{model_name}'. Got input(s) "
        f"{got}, but missing required input(s) {missing_text}. Please provide all required "
        "input(s)."
    )


def _names(names: Iterable[str]) -> str:
    return "[" + ",".join(f"'{n}'" for n in names) + "]"


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
    expected = math.prod(shape)
    # A negative dimension left (a variable one's): Triton's byte size mismatch, negative
    # expectation and all; an even number of them, which Triton would run, is refused too.
    if data.size != expected or min(shape, default=0) < 0:
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
