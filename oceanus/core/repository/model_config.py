"""config.pbtxt: parse Triton's protobuf text format into ModelConfig and normalize it.

The schema is Triton's own (``tritonclient.grpc.model_config_pb2``): field numbers and names match
Triton exactly. Normalization fills the defaults Triton fills, so `/v2/models/<m>/config` prints
what Triton would print.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.core.errors import InferenceServerError, invalid_arg, unsupported
from oceanus.core.scheduling.implicit_state import validate_states

ModelConfig = mc.ModelConfig

# platform <-> backend pairs Triton knows, with each backend's default model file name.
PLATFORM_TO_BACKEND: dict[str, str] = {
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "torch_aoti": "pytorch",  # PyTorch 2 packages (model.pt2), served by the PyTorch backend
    "tensorrt_plan": "tensorrt",
    "tensorflow_savedmodel": "tensorflow",
    "tensorflow_graphdef": "tensorflow",
}
BACKEND_TO_PLATFORM: dict[str, str] = {
    "onnxruntime": "onnxruntime_onnx",
    "pytorch": "pytorch_libtorch",
    "tensorrt": "tensorrt_plan",
}
DEFAULT_MODEL_FILENAME: dict[str, str] = {
    "onnxruntime": "model.onnx",
    "pytorch": "model.pt",
    "tensorrt": "model.plan",
    "openvino": "model.xml",
    "python": "model.py",
}
# Platforms whose default file differs from their backend's.
PLATFORM_MODEL_FILENAME: dict[str, str] = {"torch_aoti": "model.pt2"}

_NO_FIELD = re.compile(r'has no field named "(?P<field>[^"]+)"')
_MESSAGE_TYPE = re.compile(r'Message type "(?P<type>[^"]+)"')


def parse_config_text(text: str, source: str) -> mc.ModelConfig:
    """Parse config.pbtxt text; errors name the file, line and column, and suggest a field."""
    config = mc.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise invalid_arg(f"failed to parse {source}: {exc}{_suggestion(str(exc))}") from None
    return config


def _suggestion(message: str) -> str:
    """For a misspelt field name, the closest real field of that message type."""
    field_match = _NO_FIELD.search(message)
    type_match = _MESSAGE_TYPE.search(message)
    if not field_match or not type_match:
        return ""
    type_name = type_match.group("type").split(".")[-1]
    descriptor = mc.DESCRIPTOR.message_types_by_name.get(type_name)
    if descriptor is None:
        descriptor = _find_nested(type_name)
    if descriptor is None:
        return ""
    close = difflib.get_close_matches(field_match.group("field"), descriptor.fields_by_name, n=1)
    return f' (did you mean "{close[0]}"?)' if close else ""


def _find_nested(type_name: str) -> Any:
    stack = list(mc.DESCRIPTOR.message_types_by_name.values())
    while stack:
        descriptor = stack.pop()
        if descriptor.name == type_name:
            return descriptor
        stack.extend(descriptor.nested_types)
    return None


def read_config_file(path: Path) -> mc.ModelConfig:
    try:
        text = path.read_text()
    except OSError as exc:
        raise invalid_arg(f"failed to read {path}: {exc.strerror}") from None
    return parse_config_text(text, str(path))


def resolve_backend(config: mc.ModelConfig) -> None:
    """Fill `backend` from `platform` and vice versa, as Triton does."""
    if not config.backend and config.platform in PLATFORM_TO_BACKEND:
        config.backend = PLATFORM_TO_BACKEND[config.platform]
    if not config.platform and config.backend in BACKEND_TO_PLATFORM:
        config.platform = BACKEND_TO_PLATFORM[config.backend]


def normalize(config: mc.ModelConfig, *, gpu_count: int = 0) -> None:
    """Fill in the defaults Triton's normalization fills (in place)."""
    resolve_backend(config)
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    if not config.default_model_filename and config.platform in PLATFORM_MODEL_FILENAME:
        config.default_model_filename = PLATFORM_MODEL_FILENAME[config.platform]
    elif not config.default_model_filename and config.backend in DEFAULT_MODEL_FILENAME:
        config.default_model_filename = DEFAULT_MODEL_FILENAME[config.backend]
    if config.platform == "ensemble":  # no instances, nothing to optimize (as in Triton)
        return
    _normalize_optimization(config)
    _normalize_instance_groups(config, gpu_count)
    if config.HasField("dynamic_batching"):
        _normalize_dynamic_batching(config)
    if config.HasField("sequence_batching"):
        _normalize_sequence_batching(config)


def _normalize_optimization(config: mc.ModelConfig) -> None:
    optimization = config.optimization
    if not optimization.HasField("input_pinned_memory"):
        optimization.input_pinned_memory.enable = True
    if not optimization.HasField("output_pinned_memory"):
        optimization.output_pinned_memory.enable = True


def _normalize_instance_groups(config: mc.ModelConfig, gpu_count: int) -> None:
    # As Triton names them: the default group takes the model's name, an unnamed declared group
    # "<model>_<index>"; instances are then "<group>_<n>".
    if not config.instance_group:
        config.instance_group.add().name = config.name
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        if group.count < 1:
            group.count = 1
        if group.kind == mc.ModelInstanceGroup.KIND_AUTO:
            group.kind = (
                mc.ModelInstanceGroup.KIND_GPU if gpu_count > 0 else mc.ModelInstanceGroup.KIND_CPU
            )
        if group.kind == mc.ModelInstanceGroup.KIND_GPU and not group.gpus and gpu_count > 0:
            group.gpus.extend(range(gpu_count))


def _normalize_dynamic_batching(config: mc.ModelConfig) -> None:
    batching = config.dynamic_batching
    if not batching.preferred_batch_size and config.max_batch_size > 0:
        batching.preferred_batch_size.append(config.max_batch_size)
    if batching.priority_levels > 0 and batching.default_priority_level == 0:
        batching.default_priority_level = batching.priority_levels
    for size in batching.preferred_batch_size:
        if config.max_batch_size > 0 and size > config.max_batch_size:
            raise invalid_arg(
                f"dynamic batching preferred size must be <= max batch size for {config.name}"
            )


# Triton's default max_sequence_idle_microseconds (normalized into the config, as Triton does).
SEQUENCE_IDLE_DEFAULT_US = 1_000_000

_CONTROL_KINDS = {
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_START: "CONTROL_SEQUENCE_START",
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_READY: "CONTROL_SEQUENCE_READY",
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_END: "CONTROL_SEQUENCE_END",
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID: "CONTROL_SEQUENCE_CORRID",
}


def _normalize_sequence_batching(config: mc.ModelConfig) -> None:
    batching = config.sequence_batching
    if batching.max_sequence_idle_microseconds == 0:
        batching.max_sequence_idle_microseconds = SEQUENCE_IDLE_DEFAULT_US
    oldest = batching.oldest
    if batching.HasField("oldest") and not oldest.preferred_batch_size and config.max_batch_size:
        oldest.preferred_batch_size.append(config.max_batch_size)


def sequence_control_types(config: mc.ModelConfig) -> dict[str, str]:
    """The sequence batcher's control inputs: name -> Triton datatype name (INT32, FP32, BOOL,
    or the CORRID's data_type). The scheduler adds these tensors to every request; they are
    model inputs the config's `input` section does not list."""
    types: dict[str, str] = {}
    if not config.HasField("sequence_batching"):
        return types
    for control_input in config.sequence_batching.control_input:
        for control in control_input.control:
            if control.kind == mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID:
                name = mc.DataType.Name(control.data_type)[5:]
            elif control.int32_false_true:
                name = "INT32"
            elif control.fp32_false_true:
                name = "FP32"
            else:
                name = "BOOL"
            types[control_input.name] = name.replace("STRING", "BYTES")
    for state in config.sequence_batching.state:  # implicit state inputs come the same way
        types[state.input_name] = mc.DataType.Name(state.data_type)[5:].replace("STRING", "BYTES")
    return types


def sequence_state_outputs(config: mc.ModelConfig) -> set[str]:
    """The implicit state outputs: model outputs the config's `output` section does not list."""
    return {state.output_name for state in config.sequence_batching.state}


def validate_sequence_batching(config: mc.ModelConfig) -> None:
    """Checks Triton makes on `sequence_batching` (its texts), and what Oceanus cannot do yet."""
    batching = config.sequence_batching
    model = config.name
    if batching.HasField("oldest"):
        for size in batching.oldest.preferred_batch_size:
            if size <= 0:
                raise invalid_arg(
                    f"sequence batching preferred batch size must be positive for {model}"
                )
            if size > config.max_batch_size:
                raise invalid_arg(
                    f"sequence batching preferred batch size must be <= max batch size for {model}"
                )
    if batching.HasField("direct"):
        utilization = batching.direct.minimum_slot_utilization
        if utilization < 0.0 or utilization > 1.0:
            raise invalid_arg(
                "sequence batching minimum slot utilization must be in range (0.0, 1.0] for "
                f"{model}"
            )
    validate_states(config)
    if batching.iterative_sequence:
        raise unsupported(
            f"model '{model}': iterative sequences (sequence_batching 'iterative_sequence') are "
            "not supported yet by Oceanus"
        )
    seen: set[int] = set()
    names = {t.name for t in config.input}
    for control_input in batching.control_input:
        if not control_input.name:
            raise invalid_arg(f"sequence batching control tensor must have a name for {model}")
        if control_input.name in names:
            raise invalid_arg(
                f"sequence batching control tensor '{control_input.name}' is also an input of "
                f"model '{model}': control tensors must not be listed in 'input'"
            )
        names.add(control_input.name)
        if len(control_input.control) != 1:
            raise invalid_arg(
                f"sequence batching control tensor '{control_input.name}' must specify exactly "
                f"one control for {model}"
            )
        control = control_input.control[0]
        kind = _CONTROL_KINDS.get(control.kind, "")
        if not kind:
            raise invalid_arg(
                f"sequence batching control tensor '{control_input.name}' must specify a "
                f"control kind for {model}"
            )
        if control.kind in seen:
            raise invalid_arg(f"sequence batching specifies multiple {kind} tensors for {model}")
        seen.add(control.kind)
        given = [
            field
            for field in ("int32_false_true", "fp32_false_true", "bool_false_true")
            if getattr(control, field)
        ]
        if control.kind == mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID:
            if given:
                raise invalid_arg(
                    "sequence batching must not specify either 'int32_false_true', "
                    f"'fp32_false_true' or 'bool_false_true' for {kind} for {model}"
                )
            allowed = (mc.TYPE_UINT64, mc.TYPE_INT64, mc.TYPE_UINT32, mc.TYPE_INT32, mc.TYPE_STRING)
            if control.data_type not in allowed:
                raise invalid_arg(
                    f"sequence batching control tensor '{control_input.name}' must specify a "
                    f"data_type of TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or "
                    f"TYPE_STRING for {kind} for {model}"
                )
            continue
        if not given:
            raise invalid_arg(
                "sequence batching must specify either 'int32_false_true', 'fp32_false_true' "
                f"or 'bool_false_true' for {kind} for {model}"
            )
        if len(given) > 1:
            raise invalid_arg(
                "sequence batching specifies more than one from 'int32_false_true', "
                f"'fp32_false_true' and 'bool_false_true' for {kind} for {model}"
            )
        if len(getattr(control, given[0])) != 2:
            raise invalid_arg(
                f"sequence batching control '{given[0]}' must have exactly 2 entries for "
                f"{kind} for {model}"
            )


def validate_name(config: mc.ModelConfig, folder_name: str) -> None:
    if config.name and config.name != folder_name:
        raise invalid_arg(
            f"unexpected directory name '{folder_name}' for model '{config.name}', "
            "directory name must equal model name"
        )


def validate(config: mc.ModelConfig, folder_name: str) -> None:
    """Checks Triton makes on any config before a backend sees it."""
    validate_name(config, folder_name)
    if config.max_batch_size < 0:
        raise invalid_arg(f"'max_batch_size' must be non-negative value for {config.name}")
    if not config.backend and not config.platform:
        raise invalid_arg(
            f"unexpected platform type '' for {config.name}: set 'backend' or 'platform'"
        )
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for tensor in tensors:
            _validate_tensor(config, kind, tensor)
    if config.HasField("sequence_batching"):
        validate_sequence_batching(config)


def _validate_tensor(config: mc.ModelConfig, kind: str, tensor: mc.ModelInput) -> None:
    if getattr(tensor, "allow_ragged_batch", False):
        raise unsupported(
            f"model '{config.name}', {kind} '{tensor.name}': allow_ragged_batch is not supported "
            "by Oceanus yet; requests of different shapes are batched separately without it"
        )
    if not tensor.name:
        raise invalid_arg(f"model '{config.name}' has an {kind} with no name")
    if tensor.data_type == mc.TYPE_INVALID:
        raise invalid_arg(
            f"model '{config.name}' must specify 'data_type' for {kind} '{tensor.name}'"
        )
    if not tensor.dims and not tensor.HasField("reshape"):
        raise invalid_arg(f"model '{config.name}' must specify 'dims' for {kind} '{tensor.name}'")
    for dim in tensor.dims:
        if dim < -1 or dim == 0:
            raise invalid_arg(
                f"dimension for {kind} '{tensor.name}' of model '{config.name}' must be "
                f"-1 or a positive integer, got {dim}"
            )


def datatype_name(data_type: int) -> str:
    """ "TYPE_FP32" for mc.TYPE_FP32."""
    return str(mc.DataType.Name(data_type))


def config_error(model: str, exc: InferenceServerError) -> InferenceServerError:
    return InferenceServerError(exc.code, f"model '{model}': {exc.message}")
