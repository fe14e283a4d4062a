"""PyTorch backend: TorchScript models (`model.pt`) loaded with torch.jit.load, one per instance,
and PyTorch 2 packages (`model.pt2`, Triton's `torch_aoti` platform): AOTInductor packages
(torch._inductor.aoti_compile_and_package) loaded with torch._inductor.aoti_load_package, and
torch.export ExportedPrograms (torch.export.save) loaded with torch.export.load and run through
their `.module()`.

Follows Triton's PyTorch (LibTorch) backend:

- Inputs are matched to forward()'s arguments by name when every config input is an argument
  name, else by the `<name>__<index>` convention (INPUT__0 is the first argument), else in config
  order (with a warning). A forward() taking one `Dict[str, Tensor]` gets the inputs by name.
- Outputs follow `<name>__<index>` (OUTPUT__1 is the second element of the returned tuple), else
  config order. forward() may return a tensor, a tuple or list of tensors, `List[str]` for a
  TYPE_STRING output, or (beyond Triton) a `Dict[str, Tensor]` read by output name.
- TorchScript files carry no tensor types or shapes: the config must declare every input and
  output (nothing is auto-completed); output datatypes are checked when the model runs.
- TYPE_STRING tensors are `List[str]` arguments and results, one-dimensional only (the batch
  dimension included), as in Triton.
- Parameters: INFERENCE_MODE (default true), DISABLE_OPTIMIZED_EXECUTION, ENABLE_JIT_EXECUTOR,
  ENABLE_JIT_PROFILING, ENABLE_TENSOR_FUSER, DISABLE_CUDNN, ENABLE_CACHE_CLEANING,
  INTRA_OP_THREAD_COUNT (alias NUM_THREADS), INTER_OP_THREAD_COUNT (alias NUM_INTEROP_THREADS).

Threads: torch.set_num_threads() with PyTorch's OpenMP builds (Linux/x86; checked on 2.13) sets
the intra-op team size of the *calling* thread (and the default for threads that start using ATen
later). Each instance calls it on its own execution thread before its first batch (after touching
ATen once, so that a later instance's call cannot resize it), so instances of one model share the
cores (cores // instances, or INTRA_OP_THREAD_COUNT) the way ONNX Runtime sessions do. Where
PyTorch uses its native thread pool instead of OpenMP the setting is process-wide and the last
instance to start wins; `torch.__config__.parallel_info()` tells which.
.pt2 packages: inputs are matched by the exported program's input names (ExportedProgram only),
else `<name>__<index>`, else config order; outputs by `<name>__<index>`, else config order; an
ExportedProgram's recorded input/output datatypes and ranks are checked against the config.
TYPE_STRING is not supported there (exported graphs take and return tensors only).

The inter-op pool (TorchScript's fork/wait) is process-wide and can only be sized before first
use: the first model that asks for INTER_OP_THREAD_COUNT sizes it, as in Triton. The JIT switches
(executor, profiling, fuser) are process-wide too; like Triton they are applied before each
execution of a model that sets them (DISABLE_CUDNN, also process-wide, when the model loads).
"""

from __future__ import annotations

import logging
import threading
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.backends._common import (
    bool_parameter,
    config_dims,
    int_parameter,
    optional_bool_parameter,
)
from oceanus.core import datatypes
from oceanus.core.backend import Backend, BatchInstance, LoadContext, model_file
from oceanus.core.errors import invalid_arg

log = logging.getLogger("oceanus.backends.pytorch")

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

_BF16 = datatypes.BY_NAME["BF16"].dtype

# Read-only request buffers are copied before torch sees them (see _to_tensor), so torch's
# warning about non-writable arrays never applies.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

_interop_lock = threading.Lock()
# Models load on several loader threads, but neither torch.export.load (two at once:
# "_CURRENT_DESERIALIZER is already set") nor the first import of torch._inductor (a circular
# import when two threads race) is thread-safe: .pt2 packages load one at a time.
_pt2_load_lock = threading.Lock()
_interop_threads: int | None = None


def _named_index(name: str) -> int | None:
    """Triton's `<name>__<index>`: the part after the first "__" must be all digits."""
    position = name.find("__")
    if position < 0:
        return None
    tail = name[position + 2 :]
    return int(tail) if tail.isdigit() else None


def _type_kind(jit_type: Any) -> str:
    return str(jit_type.kind())


def _is_string_list(jit_type: Any) -> bool:
    return _type_kind(jit_type) == "ListType" and _type_kind(jit_type.getElementType()) == (
        "StringType"
    )


def _dtype_name(dtype: torch.dtype) -> str:
    return CONFIG_TYPE_OF.get(dtype, f"TYPE_INVALID ({dtype})")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def is_pt2(config: mc.ModelConfig, model_path: Path) -> bool:
    """Triton's `torch_aoti` platform, or any `.pt2` file named by default_model_filename."""
    return config.platform == "torch_aoti" or model_path.suffix == ".pt2"


class _Pt2Program:
    """A loaded .pt2 package: what to call and what the package says about its tensors."""

    def __init__(self, kind: str, call: Callable[..., Any], device: str) -> None:
        self.kind = kind  # "aoti" or "exported"
        self.call = call
        self.device = device
        self.input_names: list[str] | None = None
        self.input_count: int | None = None
        self.output_count: int | None = None
        # ExportedProgram only: (datatype, rank) per input / output, None where unknown.
        self.input_types: list[tuple[torch.dtype, int] | None] = []
        self.output_types: list[tuple[torch.dtype, int] | None] = []


def _pt2_kind(config: mc.ModelConfig, model_path: Path) -> str:
    """'aoti' or 'exported', from the archive's entries; anything else is a load error."""
    name = config.name
    how = (
        "make it with torch._inductor.aoti_compile_and_package(torch.export.export(model, "
        "args), package_path=...) or torch.export.save(torch.export.export(model, args), ...)"
    )
    try:
        with zipfile.ZipFile(model_path) as archive:
            entries = archive.namelist()
    except (zipfile.BadZipFile, OSError) as exc:
        raise invalid_arg(
            f"unable to load model '{name}': '{model_path.name}' is not a PyTorch 2 package "
            f"(a .pt2 zip archive; {_first_line(exc)}); {how}"
        ) from None
    # Entries below the archive's top folder (its name is the package's, e.g. "model/").
    inner = {entry.split("/", 1)[1] if "/" in entry else entry for entry in entries}
    if any(entry.startswith("data/aotinductor/") for entry in inner):
        return "aoti"
    if any(
        (entry.startswith("models/") and entry.endswith(".json"))
        or entry == "serialized_exported_program.json"
        for entry in inner
    ):
        return "exported"
    if "constants.pkl" in inner or "data.pkl" in inner:
        raise invalid_arg(
            f"unable to load model '{name}': '{model_path.name}' is a TorchScript archive, not "
            'a PyTorch 2 package: name it model.pt with platform "pytorch_libtorch", or '
            f"{how}"
        )
    raise invalid_arg(
        f"unable to load model '{name}': '{model_path.name}' holds neither an AOTInductor "
        f"model nor an ExportedProgram; {how}"
    )


def _load_pt2(config: mc.ModelConfig, model_path: Path, device: str) -> _Pt2Program:
    kind = _pt2_kind(config, model_path)
    with _pt2_load_lock:
        return _load_pt2_locked(config, model_path, device, kind)


def _load_pt2_locked(
    config: mc.ModelConfig, model_path: Path, device: str, kind: str
) -> _Pt2Program:
    name = config.name
    if kind == "aoti":
        try:
            import torch._inductor

            loader = getattr(torch._inductor, "aoti_load_package", None)
        except ImportError:
            loader = None
        if loader is None:
            raise invalid_arg(
                f"unable to load model '{name}': this PyTorch ({torch.__version__}) cannot load "
                "AOTInductor packages (torch._inductor.aoti_load_package needs PyTorch 2.6 or "
                "later)"
            )
        index = int(device.split(":")[1]) if device.startswith("cuda:") else -1
        try:
            compiled = loader(str(model_path), device_index=index)
        except Exception as exc:
            raise invalid_arg(
                f"unable to load model '{name}': torch {torch.__version__} could not load the "
                f"AOTInductor package '{model_path.name}' ({_first_line(exc)}); an AOTInductor "
                "package runs only with the PyTorch version, device type and CPU features it "
                "was compiled for"
            ) from None
        metadata = compiled.get_metadata() if hasattr(compiled, "get_metadata") else {}
        package_device = str(metadata.get("AOTI_DEVICE_KEY") or "cpu")
        if package_device == "cpu":
            device = "cpu"
        elif not device.startswith(package_device):
            raise invalid_arg(
                f"unable to load model '{name}': the AOTInductor package '{model_path.name}' "
                f"was compiled for '{package_device}', but the instance runs on '{device}'"
            )
        program = _Pt2Program("aoti", compiled, device)
        try:
            from torch.utils import _pytree

            in_spec, out_spec = compiled.loader.get_call_spec()
            program.input_count = _pytree.treespec_loads(in_spec).num_leaves
            program.output_count = _pytree.treespec_loads(out_spec).num_leaves
        except Exception:  # older packages: counts unknown, checked when called
            pass
        return program
    export: Any
    try:
        import torch.export as export
    except ImportError:
        export = None
    if export is None or not hasattr(export, "load"):
        raise invalid_arg(
            f"unable to load model '{name}': this PyTorch ({torch.__version__}) has no "
            "torch.export.load (PyTorch 2.1 or later reads ExportedProgram packages)"
        )
    try:
        exported = export.load(str(model_path))
        module = exported.module()
        if device != "cpu":
            module = module.to(device)
    except Exception as exc:
        raise invalid_arg(
            f"unable to load model '{name}': torch {torch.__version__} could not load the "
            f"ExportedProgram '{model_path.name}' ({_first_line(exc)})"
        ) from None
    program = _Pt2Program("exported", module, device)
    _describe_exported(program, exported)
    return program


def _describe_exported(program: _Pt2Program, exported: Any) -> None:
    """Input names, datatypes and ranks, and output datatypes and ranks, from the graph."""
    signature = exported.graph_signature
    user_inputs = list(signature.user_inputs)
    user_outputs = list(signature.user_outputs)
    nodes = {node.name: node for node in exported.graph.nodes}

    def described(value: Any) -> tuple[torch.dtype, int] | None:
        if isinstance(value, torch.Tensor):
            return value.dtype, value.dim()
        return None

    program.input_names = [str(n) for n in user_inputs]
    program.input_count = len(user_inputs)
    program.input_types = [
        described(nodes[n].meta.get("val")) if n in nodes else None for n in user_inputs
    ]
    program.output_count = len(user_outputs)
    output_node = next((n for n in exported.graph.nodes if n.op == "output"), None)
    returned = list(output_node.args[0]) if output_node is not None else []
    by_name = {getattr(a, "name", None): a for a in returned}
    program.output_types = [
        described(by_name[n].meta.get("val")) if n in by_name else None for n in user_outputs
    ]


class _Signature:
    """What a config maps to in forward(): argument positions and output positions."""

    def __init__(self) -> None:
        self.dict_input = False
        self.input_index: dict[str, int] = {}
        self.input_count = 0
        self.dict_output = False
        self.output_index: dict[str, int] = {}


class PyTorchBackend(Backend):
    name = "pytorch"
    default_model_filename = "model.pt"

    def __init__(self) -> None:
        self._signatures: dict[tuple[str, str], _Signature] = {}
        self._warned: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def gpu_available(self) -> bool:
        return bool(torch.cuda.is_available())

    def model_path(self, config: mc.ModelConfig, version_dir: Path) -> Path:
        default = "model.pt2" if config.platform == "torch_aoti" else "model.pt"
        return model_file(config, version_dir, default)

    # ---- config checks ------------------------------------------------------------------------

    def complete_config(self, config: mc.ModelConfig, model_path: Path, autocomplete: bool) -> None:
        pt2 = is_pt2(config, model_path)
        for kind, tensors in (("input", config.input), ("output", config.output)):
            if not tensors:
                what = "a PyTorch 2 package" if pt2 else "a TorchScript file does not record"
                raise invalid_arg(
                    f"unable to load model '{config.name}': model configuration must contain at "
                    f"least one {kind}, none were specified ("
                    + (
                        f"{what}: the PyTorch backend does not auto-complete "
                        if pt2
                        else f"{what} its {kind} names, datatypes or shapes, so the PyTorch "
                        "backend cannot auto-complete them: "
                    )
                    + f"list every {kind} in config.pbtxt)"
                )
        for name in (
            "INFERENCE_MODE",
            "DISABLE_OPTIMIZED_EXECUTION",
            "DISABLE_CUDNN",
            "ENABLE_CACHE_CLEANING",
            "ENABLE_JIT_EXECUTOR",
            "ENABLE_JIT_PROFILING",
            "ENABLE_TENSOR_FUSER",
        ):
            optional_bool_parameter(config, name)
        for name in ("INTRA_OP_THREAD_COUNT", "NUM_THREADS"):
            int_parameter(config, name, minimum=1)
        for name in ("INTER_OP_THREAD_COUNT", "NUM_INTEROP_THREADS"):
            int_parameter(config, name, minimum=1)
        if pt2:
            signature = self._pt2_signature(config, _load_pt2(config, model_path, "cpu"))
        else:
            signature = self._signature(config, self._jit_load(config, model_path, "cpu"))
        with self._lock:
            self._signatures[(config.name, str(model_path))] = signature

    def _jit_load(self, config: mc.ModelConfig, model_path: Path, device: str) -> Any:
        try:
            module = torch.jit.load(str(model_path), map_location=device)
        except Exception as exc:  # not TorchScript (a pickled state_dict, a .pt2 archive, ...)
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc)
            raise invalid_arg(
                f"unable to load model '{config.name}': '{model_path.name}' is not a TorchScript "
                f"model that torch.jit.load can read ({first_line}); save it with "
                f"torch.jit.script(model).save(...) or torch.jit.trace(...).save(...)"
            ) from None
        module.eval()
        return module

    def _signature(self, config: mc.ModelConfig, module: Any) -> _Signature:
        try:
            schema = module.forward.schema
        except Exception:
            raise invalid_arg(
                f"unable to load model '{config.name}': the TorchScript module has no forward()"
            ) from None
        arguments = list(schema.arguments)
        if arguments and _type_kind(arguments[0].type) == "ClassType":
            arguments = arguments[1:]  # self
        signature = _Signature()
        self._map_inputs(config, arguments, signature)
        returns = list(schema.returns)
        self._map_outputs(config, returns[0].type if len(returns) == 1 else None, signature)
        return signature

    def _map_inputs(self, config: mc.ModelConfig, arguments: list[Any], sig: _Signature) -> None:
        name = config.name
        if len(arguments) == 1 and _type_kind(arguments[0].type) == "DictType":
            sig.dict_input = True
            value_type = arguments[0].type.getValueType()
            if _type_kind(value_type) != "TensorType":
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
                self._check_tensor_type(config, "input", tensor)
            return
        for argument in arguments:
            kind = _type_kind(argument.type)
            if kind == "DictType":
                raise invalid_arg(
                    f"unable to load model '{name}': Multiple inputs of kind DictType were "
                    "detected. Only a single input of type Dict(str, Tensor) is supported."
                )
            if kind != "TensorType" and not _is_string_list(argument.type):
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
        elif all(_named_index(n) is not None for n in config_names):
            sig.input_index = {n: int(_named_index(n)) for n in config_names}  # type: ignore[arg-type]
        else:
            log.warning(
                "input '%s' or previous input(s) are neither an input argument to the model "
                "'%s' nor do they follow the <name>__<index> naming convention. Falling back "
                "to enforcing strict ordering from model configuration.",
                next(
                    n for n in config_names if n not in argument_names and _named_index(n) is None
                ),
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
            if _is_string_list(argument.type):
                if tensor.data_type != mc.TYPE_STRING:
                    raise invalid_arg(
                        f"unable to load model '{name}': input '{tensor.name}' is "
                        f"{mc.DataType.Name(tensor.data_type)} but forward() takes List[str] for "
                        f"argument '{argument.name}': declare it TYPE_STRING"
                    )
                self._check_string_dims(config, "input", tensor)
            elif tensor.data_type == mc.TYPE_STRING:
                raise invalid_arg(
                    f"unable to load model '{name}': input '{tensor.name}' is TYPE_STRING but "
                    f"forward() takes a Tensor for argument '{argument.name}'; PyTorch has no "
                    "string tensors: declare the argument List[str]"
                )
            else:
                self._check_tensor_type(config, "input", tensor)

    def _map_outputs(self, config: mc.ModelConfig, returns: Any, sig: _Signature) -> None:
        name = config.name
        config_names = [t.name for t in config.output]
        kind = _type_kind(returns) if returns is not None else ""
        # Element types of the result, when the schema tells them (None: any number of tensors).
        elements: list[Any] | None
        if kind == "TupleType":
            elements = list(returns.elements())
        elif kind == "TensorType" or _is_string_list(returns):
            elements = [returns]
        elif kind == "DictType":
            sig.dict_output = True
            for tensor in config.output:
                self._check_tensor_type(config, "output", tensor)
            return
        elif kind == "ListType" and _type_kind(returns.getElementType()) == "TensorType":
            elements = None
        else:
            raise invalid_arg(
                f"unable to load model '{name}': forward() returns '{returns}'; the output must "
                "be of type Tensor, List[str] or a Tuple/List of these"
            )
        if all(_named_index(n) is not None for n in config_names):
            sig.output_index = {n: int(_named_index(n)) for n in config_names}  # type: ignore[arg-type]
        else:
            log.warning(
                "output '%s' or previous output(s) of the model '%s' do not follow the "
                "<name>__<index> naming convention. Falling back to enforcing strict ordering "
                "from model configuration.",
                next(n for n in config_names if _named_index(n) is None),
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
            if element is not None and _is_string_list(element):
                if tensor.data_type != mc.TYPE_STRING:
                    raise invalid_arg(
                        f"unable to load model '{name}': output '{tensor.name}' is "
                        f"{mc.DataType.Name(tensor.data_type)} but forward() returns List[str] "
                        "for it: declare it TYPE_STRING"
                    )
                self._check_string_dims(config, "output", tensor)
            elif tensor.data_type == mc.TYPE_STRING:
                raise invalid_arg(
                    f"unable to load model '{name}': output '{tensor.name}' is TYPE_STRING but "
                    "forward() returns a Tensor for it; PyTorch has no string tensors: return "
                    "List[str]"
                )
            else:
                self._check_tensor_type(config, "output", tensor)

    def _pt2_signature(self, config: mc.ModelConfig, program: _Pt2Program) -> _Signature:
        """Map the config onto a .pt2 program's flat tensor inputs and outputs."""
        name = config.name
        sig = _Signature()
        for kind, tensors in (("input", config.input), ("output", config.output)):
            for tensor in tensors:
                if tensor.data_type == mc.TYPE_STRING:
                    raise invalid_arg(
                        f"unable to load model '{name}': {kind} '{tensor.name}' is TYPE_STRING, "
                        "but a PyTorch 2 package takes and returns tensors only"
                    )
                self._check_tensor_type(config, kind, tensor)
        count = program.input_count
        if count is not None and count != len(config.input):
            raise invalid_arg(
                f"unable to load model '{name}', configuration expects {len(config.input)} "
                f"inputs, model provides {count}"
            )
        sig.input_count = count if count is not None else len(config.input)
        config_names = [t.name for t in config.input]
        names = program.input_names or []
        if names and all(n in names for n in config_names):
            sig.input_index = {n: names.index(n) for n in config_names}
        elif all(_named_index(n) is not None for n in config_names):
            sig.input_index = {n: int(_named_index(n)) for n in config_names}  # type: ignore[arg-type]
        else:
            log.warning(
                "input '%s' or previous input(s) of the model '%s' are neither an input name of "
                "the program nor follow the <name>__<index> naming convention. Falling back to "
                "enforcing strict ordering from model configuration.",
                next(n for n in config_names if n not in names and _named_index(n) is None),
                name,
            )
            sig.input_index = {n: i for i, n in enumerate(config_names)}
        seen: dict[int, str] = {}
        for tensor in config.input:
            index = sig.input_index[tensor.name]
            if index >= sig.input_count:
                raise invalid_arg(
                    f"unable to load model '{name}': input '{tensor.name}' refers to input "
                    f"{index}, but the program takes {sig.input_count} input(s)"
                )
            if index in seen:
                raise invalid_arg(
                    f"unable to load model '{name}': inputs '{seen[index]}' and '{tensor.name}' "
                    f"both refer to input {index}"
                )
            seen[index] = tensor.name
            known = program.input_types[index] if index < len(program.input_types) else None
            self._check_recorded(config, "input", tensor, known)
        output_names = [t.name for t in config.output]
        if all(_named_index(n) is not None for n in output_names):
            sig.output_index = {n: int(_named_index(n)) for n in output_names}  # type: ignore[arg-type]
        else:
            sig.output_index = {n: i for i, n in enumerate(output_names)}
        for tensor in config.output:
            index = sig.output_index[tensor.name]
            if program.output_count is not None and index >= program.output_count:
                raise invalid_arg(
                    f"unable to load model '{name}': output '{tensor.name}' refers to output "
                    f"index {index}, but the program returns {program.output_count} output(s)"
                )
            known = program.output_types[index] if index < len(program.output_types) else None
            self._check_recorded(config, "output", tensor, known)
        return sig

    @staticmethod
    def _check_recorded(
        config: mc.ModelConfig, kind: str, tensor: Any, known: tuple[torch.dtype, int] | None
    ) -> None:
        """An ExportedProgram records each tensor's datatype and rank: check the config's."""
        if known is None:
            return
        dtype, rank = known
        model_type = _dtype_name(dtype)
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

    @staticmethod
    def _check_tensor_type(config: mc.ModelConfig, kind: str, tensor: Any) -> None:
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

    @staticmethod
    def _check_string_dims(config: mc.ModelConfig, kind: str, tensor: Any) -> None:
        if len(config_dims(tensor)) + (1 if config.max_batch_size > 0 else 0) > 1:
            raise invalid_arg(
                f"Triton only supports 1 dimensional List of String as {kind} for "
                f"'{tensor.name}' for model '{config.name}'"
            )

    # ---- instances ----------------------------------------------------------------------------

    def load(self, context: LoadContext) -> BatchInstance:
        config, model_path, spec = context.config, context.files.model_path, context.spec
        with self._lock:
            signature = self._signatures.get((config.name, str(model_path)))
        pt2 = is_pt2(config, model_path)
        if signature is None:  # a version other than the one complete_config read
            signature = (
                self._pt2_signature(config, _load_pt2(config, model_path, "cpu"))
                if pt2
                else self._signature(config, self._jit_load(config, model_path, "cpu"))
            )
        device = "cpu"
        if spec.kind == "GPU":
            if torch.cuda.is_available():
                device = f"cuda:{spec.device_id}"
            else:
                key = (config.name, "gpu")
                if key not in self._warned:
                    self._warned.add(key)
                    log.warning(
                        "model '%s': KIND_GPU instance but this PyTorch (%s) has no CUDA; "
                        "running it on the CPU",
                        config.name,
                        torch.__version__,
                    )
        self._size_interop_pool(config)
        module: Any
        if pt2:
            program = _load_pt2(config, model_path, device)
            device = program.device  # a CPU AOTInductor package runs on the CPU
            module = program.call
        else:
            module = self._jit_load(config, model_path, device)
        if bool_parameter(config, "DISABLE_CUDNN", False):
            torch.backends.cudnn.enabled = False
        intra = int_parameter(config, "INTRA_OP_THREAD_COUNT", 1) or int_parameter(
            config, "NUM_THREADS", 1
        )
        threads = intra or max(1, spec.cpu_threads)
        return PyTorchInstance(config, module, signature, torch.device(device), threads)

    def _size_interop_pool(self, config: mc.ModelConfig) -> None:
        global _interop_threads
        wanted = int_parameter(config, "INTER_OP_THREAD_COUNT", 1) or int_parameter(
            config, "NUM_INTEROP_THREADS", 1
        )
        if wanted is None:
            return
        with _interop_lock:
            if _interop_threads is None:
                try:
                    torch.set_num_interop_threads(wanted)
                    _interop_threads = wanted
                    return
                except RuntimeError as exc:  # already used: its size is fixed for the process
                    _interop_threads = torch.get_num_interop_threads()
                    log.warning("model '%s': INTER_OP_THREAD_COUNT ignored: %s", config.name, exc)
                    return
            if _interop_threads != wanted:
                log.warning(
                    "model '%s': INTER_OP_THREAD_COUNT %d ignored: the process-wide inter-op "
                    "pool already has %d threads (the first model's setting wins, as in Triton)",
                    config.name,
                    wanted,
                    _interop_threads,
                )


class PyTorchInstance(BatchInstance):
    def __init__(
        self,
        config: mc.ModelConfig,
        module: Any,
        signature: _Signature,
        device: torch.device,
        threads: int,
    ) -> None:
        self._name = config.name
        self._module = module
        # TorchScript modules are called through forward(); .pt2 programs are callables.
        self._call: Callable[..., Any] | None = (
            module.forward if isinstance(module, torch.jit.ScriptModule) else module
        )
        self._sig = signature
        self._device = device
        self._threads = threads
        self._thread_id: int | None = None
        self._inference_mode = bool_parameter(config, "INFERENCE_MODE", True)
        self._optimize = not bool_parameter(config, "DISABLE_OPTIMIZED_EXECUTION", False)
        self._jit_executor = optional_bool_parameter(config, "ENABLE_JIT_EXECUTOR")
        self._jit_profiling = optional_bool_parameter(config, "ENABLE_JIT_PROFILING")
        self._tensor_fuser = optional_bool_parameter(config, "ENABLE_TENSOR_FUSER")
        self._clean_cache = device.type == "cuda" and bool_parameter(
            config, "ENABLE_CACHE_CLEANING", False
        )
        self._input_types = {
            t.name: TORCH_TYPES.get(mc.DataType.Name(t.data_type)) for t in config.input
        }
        self._outputs = [(t.name, mc.DataType.Name(t.data_type)) for t in config.output]
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def _configure_thread(self) -> None:
        """Per-thread settings, made once on the instance's own execution thread."""
        self._thread_id = threading.get_ident()
        if self._device.type == "cpu":
            # ATen sizes a thread's OpenMP team from the process-wide value the first time the
            # thread runs an operator: do that first, or another instance's later
            # set_num_threads() would become this thread's size.
            torch.get_num_threads()
            torch.set_num_threads(self._threads)
        torch._C._set_graph_executor_optimize(self._optimize)

    def _global_switches(self) -> None:
        """Process-wide JIT switches, applied before each run only when the config sets them."""
        if self._jit_executor is not None:
            torch._C._jit_set_profiling_executor(self._jit_executor)
        if self._jit_profiling is not None and hasattr(torch._C, "_jit_set_profiling_mode"):
            torch._C._jit_set_profiling_mode(self._jit_profiling)
        if self._tensor_fuser is not None:
            torch._C._jit_set_texpr_fuser_enabled(self._tensor_fuser)

    def execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._thread_id != threading.get_ident():
            self._configure_thread()
        self._global_switches()
        if self._stream is not None:
            with torch.cuda.stream(self._stream):
                outputs = self._run(inputs)
            if self._clean_cache:
                torch.cuda.empty_cache()
            return outputs
        return self._run(inputs)

    def _run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        guard = torch.inference_mode() if self._inference_mode else torch.no_grad()
        with guard:
            if self._sig.dict_input:
                assert self._call is not None
                result = self._call(
                    {name: self._to_tensor(name, array) for name, array in inputs.items()}
                )
            else:
                arguments: list[Any] = [None] * self._sig.input_count
                for name, array in inputs.items():
                    arguments[self._sig.input_index[name]] = self._to_tensor(name, array)
                assert self._call is not None
                result = self._call(*arguments)
            return self._read_outputs(result)

    def _to_tensor(self, name: str, array: np.ndarray) -> Any:
        if array.dtype == np.dtype(object):
            try:
                return [b.decode() if isinstance(b, bytes) else str(b) for b in array.reshape(-1)]
            except UnicodeDecodeError:
                raise invalid_arg(
                    f"input '{name}' holds bytes that are not valid UTF-8, which TorchScript "
                    "List[str] arguments cannot carry"
                ) from None
        if not array.flags.writeable or not array.flags.c_contiguous:
            # Request bodies are read-only views; the model may write into its inputs.
            array = np.array(array, order="C")
        if array.dtype == _BF16:
            tensor = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        else:
            tensor = torch.from_numpy(array)
        if self._device.type != "cpu":
            tensor = tensor.to(self._device, non_blocking=True)
        return tensor

    def _read_outputs(self, result: Any) -> dict[str, np.ndarray]:
        if self._sig.dict_output:
            if not isinstance(result, dict):
                raise invalid_arg(f"output of model '{self._name}' must be a Dict[str, Tensor]")
            values: Any = result
        elif isinstance(result, torch.Tensor) or (
            isinstance(result, list) and (not result or isinstance(result[0], str))
        ):
            values = [result]
        elif isinstance(result, tuple | list):
            values = list(result)
        else:
            raise invalid_arg(
                "output must be of type Tensor, List[str] or Tuple containing one of these two "
                f"types, got {type(result).__name__}"
            )
        outputs: dict[str, np.ndarray] = {}
        for name, config_type in self._outputs:
            if self._sig.dict_output:
                if name not in values:
                    raise invalid_arg(f"output tensor '{name}' is not found")
                value = values[name]
            else:
                index = self._sig.output_index[name]
                if index >= len(values):
                    raise invalid_arg(
                        f"The output {name} in the model configuration refers to an output "
                        f"index which doesn't exist. This model has {len(values)} outputs"
                    )
                value = values[index]
            outputs[name] = self._to_numpy(name, config_type, value)
        return outputs

    def _to_numpy(self, name: str, config_type: str, value: Any) -> np.ndarray:
        if isinstance(value, list) and config_type == "TYPE_STRING":
            return np.array(
                [s.encode() if isinstance(s, str) else bytes(s) for s in value], dtype=object
            )
        if not isinstance(value, torch.Tensor):
            raise invalid_arg(
                f"output '{name}' must be of type Tensor or List[str], got {type(value).__name__}"
            )
        model_type = _dtype_name(value.dtype)
        if model_type != config_type:
            raise invalid_arg(
                f"configuration expects datatype {config_type} for output '{name}', model "
                f"provides {model_type}"
            )
        if value.dim() == 0:
            raise invalid_arg(f"output '{name}' is a scalar which is not supported.")
        value = value.detach()
        if value.device.type != "cpu":
            value = value.cpu()
        value = value.contiguous()
        if value.dtype == torch.bfloat16:
            return value.view(torch.int16).numpy().view(_BF16)
        return value.numpy()

    def close(self) -> None:
        self._module = None
        self._call = None
