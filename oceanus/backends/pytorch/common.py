"""What the TorchScript and PyTorch 2 paths share: datatypes, the config-to-signature map, and
Triton's checks of config tensors."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.backends._common import config_dims
from oceanus.core import datatypes
from oceanus.core.errors import invalid_arg
from oceanus.core.types import is_number

# ModelConfig datatype -> torch dtype: every datatype this torch can hold in a tensor.
TORCH_TYPES: dict[str, torch.dtype] = {
    "TYPE_BOOL": torch.bool,
    "TYPE_UINT8": torch.uint8,
    "TYPE_INT8": torch.int8,
    "TYPE_INT16": torch.int16,
    "TYPE_INT32": torch.int32,
    "TYPE_INT64": torch.int64,
    "TYPE_FP16": torch.float16,
    "TYPE_FP32": torch.float32,
    "TYPE_FP64": torch.float64,
    "TYPE_BF16": torch.bfloat16,
}
# Unsigned integers wider than 8 bits exist since torch 2.3 (few operators accept them).
for _bits in (16, 32, 64):
    _dtype = getattr(torch, f"uint{_bits}", None)
    if isinstance(_dtype, torch.dtype):
        TORCH_TYPES[f"TYPE_UINT{_bits}"] = _dtype
CONFIG_TYPE_OF: dict[torch.dtype, str] = {v: k for k, v in TORCH_TYPES.items()}

BF16 = datatypes.BY_NAME["BF16"].dtype

# Read-only request buffers are copied before torch sees them (instance.py `_to_tensor`), so
# torch's warning about non-writable arrays never applies.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


def named_index(name: str) -> int | None:
    """Triton's `<name>__<index>`: the part after the first "__" must be all digits."""
    position = name.find("__")
    if position < 0:
        return None
    tail = name[position + 2 :]
    return int(tail) if is_number(tail) else None


def type_kind(jit_type: Any) -> str:
    return str(jit_type.kind())


def is_string_list(jit_type: Any) -> bool:
    return type_kind(jit_type) == "ListType" and type_kind(jit_type.getElementType()) == (
        "StringType"
    )


def dtype_name(dtype: torch.dtype) -> str:
    return CONFIG_TYPE_OF.get(dtype, f"TYPE_INVALID ({dtype})")


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class Signature:
    """What a config maps to in forward(): argument positions and output positions."""

    def __init__(self) -> None:
        self.dict_input = False
        self.input_index: dict[str, int] = {}
        self.input_count = 0
        self.dict_output = False
        self.output_index: dict[str, int] = {}


def check_recorded(
    config: mc.ModelConfig, kind: str, tensor: Any, known: tuple[torch.dtype, int] | None
) -> None:
    """An ExportedProgram records each tensor's datatype and rank: check the config's."""
    if known is None:
        return
    dtype, rank = known
    model_type = dtype_name(dtype)
    config_type = mc.DataType.Name(tensor.data_type)
    if model_type != config_type:
        raise invalid_arg(
            f"unable to load model '{config.name}', configuration expects datatype "
            f"{config_type} for {kind} '{tensor.name}', model provides {model_type}"
        )
    dims = config_dims(tensor)
    expected = len(dims) + (1 if config.max_batch_size > 0 else 0)
    if tensor.HasField("reshape") or rank == expected:
        return
    raise invalid_arg(
        f"unable to load model '{config.name}', {kind} '{tensor.name}' has {rank} "
        f"dimension(s) in the model, but the configuration's dims {dims}"
        + (" (with the batch dimension)" if config.max_batch_size > 0 else "")
        + f" make {expected}"
    )


def check_tensor_type(config: mc.ModelConfig, kind: str, tensor: Any) -> None:
    type_name = mc.DataType.Name(tensor.data_type)
    if type_name not in TORCH_TYPES:
        raise invalid_arg(
            f"unsupported datatype {type_name} for {kind} '{tensor.name}' for model "
            f"'{config.name}'"
            + (
                ": PyTorch has no string tensors (use List[str] in forward())"
                if type_name == "TYPE_STRING"
                else f" (torch {torch.__version__} has no such tensor type)"
            )
        )


def check_string_dims(config: mc.ModelConfig, kind: str, tensor: Any) -> None:
    if len(config_dims(tensor)) + (1 if config.max_batch_size > 0 else 0) > 1:
        raise invalid_arg(
            f"Triton only supports 1 dimensional List of String as {kind} for "
            f"'{tensor.name}' for model '{config.name}'"
        )
