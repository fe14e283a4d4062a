"""PyTorch 2 packages (`model.pt2`, Triton's `torch_aoti` platform): AOTInductor packages and
torch.export ExportedPrograms, and mapping the config onto their flat tensor inputs and outputs."""

from __future__ import annotations

import logging
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.backends.pytorch.common import (
    Signature,
    check_recorded,
    check_tensor_type,
    first_line,
    named_index,
)
from oceanus.core.errors import invalid_arg

log = logging.getLogger("oceanus.backends.pytorch")

# Models load on several loader threads, but neither torch.export.load (two at once:
# "_CURRENT_DESERIALIZER is already set") nor the first import of torch._inductor (a circular
# import when two threads race) is thread-safe: .pt2 packages load one at a time.
_pt2_load_lock = threading.Lock()


def is_pt2(config: mc.ModelConfig, model_path: Path) -> bool:
    """Triton's `torch_aoti` platform, or any `.pt2` file named by default_model_filename."""
    return config.platform == "torch_aoti" or model_path.suffix == ".pt2"


class Pt2Program:
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
            f"(a .pt2 zip archive; {first_line(exc)}); {how}"
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


def load_pt2(config: mc.ModelConfig, model_path: Path, device: str) -> Pt2Program:
    kind = _pt2_kind(config, model_path)
    with _pt2_load_lock:
        return _load_pt2_locked(config, model_path, device, kind)


def _load_pt2_locked(
    config: mc.ModelConfig, model_path: Path, device: str, kind: str
) -> Pt2Program:
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
                f"AOTInductor package '{model_path.name}' ({first_line(exc)}); an AOTInductor "
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
        program = Pt2Program("aoti", compiled, device)
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
            f"ExportedProgram '{model_path.name}' ({first_line(exc)})"
        ) from None
    program = Pt2Program("exported", module, device)
    _describe_exported(program, exported)
    return program


def _describe_exported(program: Pt2Program, exported: Any) -> None:
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


def pt2_signature(config: mc.ModelConfig, program: Pt2Program) -> Signature:
    """Map the config onto a .pt2 program's flat tensor inputs and outputs."""
    name = config.name
    sig = Signature()
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for tensor in tensors:
            if tensor.data_type == mc.TYPE_STRING:
                raise invalid_arg(
                    f"unable to load model '{name}': {kind} '{tensor.name}' is TYPE_STRING, "
                    "but a PyTorch 2 package takes and returns tensors only"
                )
            check_tensor_type(config, kind, tensor)
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
    elif all(named_index(n) is not None for n in config_names):
        sig.input_index = {n: int(named_index(n)) for n in config_names}  # type: ignore[arg-type]
    else:
        log.warning(
            "input '%s' or previous input(s) of the model '%s' are neither an input name of "
            "the program nor follow the <name>__<index> naming convention. Falling back to "
            "enforcing strict ordering from model configuration.",
            next(n for n in config_names if n not in names and named_index(n) is None),
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
        check_recorded(config, "input", tensor, known)
    output_names = [t.name for t in config.output]
    if all(named_index(n) is not None for n in output_names):
        sig.output_index = {n: int(named_index(n)) for n in output_names}  # type: ignore[arg-type]
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
        check_recorded(config, "output", tensor, known)
    return sig
