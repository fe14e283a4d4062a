"""TorchScript models (`model.pt`): loading, and mapping the config onto forward()'s schema."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.backends.pytorch.common import (
    Signature,
    check_string_dims,
    check_tensor_type,
    first_line,
    is_string_list,
    named_index,
    type_kind,
)
from oceanus.core.errors import invalid_arg

log = logging.getLogger("oceanus.backends.pytorch")


def jit_load(config: mc.ModelConfig, model_path: Path, device: str) -> Any:
    try:
        module = torch.jit.load(str(model_path), map_location=device)
    except Exception as exc:  # not TorchScript (a pickled state_dict, a .pt2 archive, ...)
        raise invalid_arg(
            f"unable to load model '{config.name}': '{model_path.name}' is not a TorchScript "
            f"model that torch.jit.load can read ({first_line(exc)}); save it with "
            f"torch.jit.script(model).save(...) or torch.jit.trace(...).save(...)"
        ) from None
    module.eval()
    return module


def torchscript_signature(config: mc.ModelConfig, module: Any) -> Signature:
    try:
        schema = module.forward.schema
    except Exception:
        raise invalid_arg(
            f"unable to load model '{config.name}': the TorchScript module has no forward()"
        ) from None
    arguments = list(schema.arguments)
    if arguments and type_kind(arguments[0].type) == "ClassType":
        arguments = arguments[1:]  # self
    signature = Signature()
    _map_inputs(config, arguments, signature)
    returns = list(schema.returns)
    _map_outputs(config, returns[0].type if len(returns) == 1 else None, signature)
    return signature


def _map_inputs(config: mc.ModelConfig, arguments: list[Any], sig: Signature) -> None:
    name = config.name
    if len(arguments) == 1 and type_kind(arguments[0].type) == "DictType":
        sig.dict_input = True
        value_type = arguments[0].type.getValueType()
        if type_kind(value_type) != "TensorType":
            raise invalid_arg(
                f"unable to load model '{name}': forward() takes "
                f"'{arguments[0].type}'; only Dict(str, Tensor) is supported"
            )
        for tensor in config.input:
            if tensor.data_type == mc.TYPE_STRING:
                raise invalid_arg(
                    f"unable to load model '{name}': input '{tensor.name}' is TYPE_STRING "
                    "but forward() takes a Dict(str, Tensor), which cannot hold strings"
                )
            check_tensor_type(config, "input", tensor)
        return
    for argument in arguments:
        kind = type_kind(argument.type)
        if kind == "DictType":
            raise invalid_arg(
                f"unable to load model '{name}': Multiple inputs of kind DictType were "
                "detected. Only a single input of type Dict(str, Tensor) is supported."
            )
        if kind != "TensorType" and not is_string_list(argument.type):
            raise invalid_arg(
                f"unable to load model '{name}': An input of type '{argument.type}' was "
                f"detected in the model (argument '{argument.name}'). Only a single input "
                "of type Dict(str, Tensor) or input(s) of type Tensor (or List[str] for "
                "TYPE_STRING) are supported."
            )
    if len(arguments) != len(config.input):
        raise invalid_arg(
            f"unable to load model '{name}', configuration expects {len(config.input)} "
            f"inputs, model provides {len(arguments)}"
        )
    sig.input_count = len(arguments)
    argument_names = [a.name for a in arguments]
    config_names = [t.name for t in config.input]
    if all(n in argument_names for n in config_names):
        sig.input_index = {n: argument_names.index(n) for n in config_names}
    elif all(named_index(n) is not None for n in config_names):
        sig.input_index = {n: int(named_index(n)) for n in config_names}  # type: ignore[arg-type]
    else:
        log.warning(
            "input '%s' or previous input(s) are neither an input argument to the model "
            "'%s' nor do they follow the <name>__<index> naming convention. Falling back "
            "to enforcing strict ordering from model configuration.",
            next(n for n in config_names if n not in argument_names and named_index(n) is None),
            name,
        )
        sig.input_index = {n: i for i, n in enumerate(config_names)}
    seen: dict[int, str] = {}
    for tensor in config.input:
        index = sig.input_index[tensor.name]
        if index >= len(arguments):
            raise invalid_arg(
                f"unable to load model '{name}': input '{tensor.name}' refers to forward() "
                f"argument {index}, but forward() takes {len(arguments)} input(s): "
                + ", ".join(f"'{a}'" for a in argument_names)
            )
        if index in seen:
            raise invalid_arg(
                f"unable to load model '{name}': inputs '{seen[index]}' and '{tensor.name}' "
                f"both refer to forward() argument {index} ('{argument_names[index]}')"
            )
        seen[index] = tensor.name
        argument = arguments[index]
        if is_string_list(argument.type):
            if tensor.data_type != mc.TYPE_STRING:
                raise invalid_arg(
                    f"unable to load model '{name}': input '{tensor.name}' is "
                    f"{mc.DataType.Name(tensor.data_type)} but forward() takes List[str] for "
                    f"argument '{argument.name}': declare it TYPE_STRING"
                )
            check_string_dims(config, "input", tensor)
        elif tensor.data_type == mc.TYPE_STRING:
            raise invalid_arg(
                f"unable to load model '{name}': input '{tensor.name}' is TYPE_STRING but "
                f"forward() takes a Tensor for argument '{argument.name}'; PyTorch has no "
                "string tensors: declare the argument List[str]"
            )
        else:
            check_tensor_type(config, "input", tensor)


def _map_outputs(config: mc.ModelConfig, returns: Any, sig: Signature) -> None:
    name = config.name
    config_names = [t.name for t in config.output]
    kind = type_kind(returns) if returns is not None else ""
    # Element types of the result, when the schema tells them (None: any number of tensors).
    elements: list[Any] | None
    if kind == "TupleType":
        elements = list(returns.elements())
    elif kind == "TensorType" or is_string_list(returns):
        elements = [returns]
    elif kind == "DictType":
        sig.dict_output = True
        for tensor in config.output:
            check_tensor_type(config, "output", tensor)
        return
    elif kind == "ListType" and type_kind(returns.getElementType()) == "TensorType":
        elements = None
    else:
        raise invalid_arg(
            f"unable to load model '{name}': forward() returns '{returns}'; the output must "
            "be of type Tensor, List[str] or a Tuple/List of these"
        )
    if all(named_index(n) is not None for n in config_names):
        sig.output_index = {n: int(named_index(n)) for n in config_names}  # type: ignore[arg-type]
    else:
        log.warning(
            "output '%s' or previous output(s) of the model '%s' do not follow the "
            "<name>__<index> naming convention. Falling back to enforcing strict ordering "
            "from model configuration.",
            next(n for n in config_names if named_index(n) is None),
            name,
        )
        sig.output_index = {n: i for i, n in enumerate(config_names)}
    for tensor in config.output:
        index = sig.output_index[tensor.name]
        element = None
        if elements is not None:
            if index >= len(elements):
                raise invalid_arg(
                    f"unable to load model '{name}': output '{tensor.name}' refers to output "
                    f"index {index}, but forward() returns {len(elements)} output(s) "
                    f"({returns})"
                )
            element = elements[index]
        if element is not None and is_string_list(element):
            if tensor.data_type != mc.TYPE_STRING:
                raise invalid_arg(
                    f"unable to load model '{name}': output '{tensor.name}' is "
                    f"{mc.DataType.Name(tensor.data_type)} but forward() returns List[str] "
                    "for it: declare it TYPE_STRING"
                )
            check_string_dims(config, "output", tensor)
        elif tensor.data_type == mc.TYPE_STRING:
            raise invalid_arg(
                f"unable to load model '{name}': output '{tensor.name}' is TYPE_STRING but "
                "forward() returns a Tensor for it; PyTorch has no string tensors: return "
                "List[str]"
            )
        else:
            check_tensor_type(config, "output", tensor)
