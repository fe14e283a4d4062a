"""Advice for the log when a model fails to load: what to change for the common mistakes of a
first repository. The error a client sees keeps Triton's words; these hints only go beside it in
the log line (InferenceServerError.hint)."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from pathlib import Path

# Not imported from core.repository: the backend registry uses this module, and the repository
# module imports the registry.
CONFIG_FILENAME = "config.pbtxt"
_EXAMPLE_FILE = "model.onnx"


def version_folder_hint(folder: Path, versions: Collection[int]) -> str:
    """Why the model folder has no usable version folder ("" when it has `versions`)."""
    if versions:
        return ""
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return ""
    files = [e.name for e in entries if e.is_file() and e.name != CONFIG_FILENAME]
    folders = [e.name for e in entries if e.is_dir() and not e.name.startswith(".")]
    name = folder.name
    example = files[0] if files else _EXAMPLE_FILE
    hint = (
        f"no version folder: expected a numbered folder such as '{name}/1/' holding the model "
        f"file ({name}/1/{example})"
    )
    if files:
        hint += f"; move {', '.join(files)} from '{name}/' into '{name}/1/'"
    if folders:
        hint += (
            f"; {', '.join(repr(f) for f in folders)} "
            f"{'is not a version folder' if len(folders) == 1 else 'are not version folders'} "
            "(versions are numbers: 1, 2, ...)"
        )
    return hint


def version_policy_hint(folder: Path, versions: Collection[int]) -> str:
    """The version folders there are, when the config's version_policy selects none of them."""
    numbers = sorted(versions)
    if not numbers:
        return version_folder_hint(folder, versions)
    listed = ", ".join(f"'{folder.name}/{n}/'" for n in numbers)
    return f"the config's version_policy selects none of the version folders there ({listed})"


def unknown_backend_hint(name: str, backends: Iterable[str], platforms: Iterable[str]) -> str:
    """What a config may name instead of backend `name` (the error itself lists the backends
    for a name that is not empty)."""
    known = f"known platforms: {', '.join(sorted(platforms)) or 'none'}"
    if name:
        return known
    return (
        f"{CONFIG_FILENAME} names no backend or platform and no version folder holds a model "
        f'file auto-complete recognizes (model.onnx, model.py, ...); set backend: "..." '
        f"(known backends: {', '.join(sorted(backends)) or 'none'}) or {known}"
    )


def shape_hint(tensor: str, model_shape: list[int], config_shape: list[int], batched: bool) -> str:
    """Both shapes side by side, and the dims that would match the model file."""
    model_text = "[" + ",".join(str(d) for d in model_shape) + "]"
    config_text = "[" + ",".join(str(d) for d in config_shape) + "]"
    wanted = model_shape[1:] if batched and model_shape else model_shape
    dims = ", ".join(str(d) for d in wanted)
    batch_note = " with the batch dimension max_batch_size adds" if batched else ""
    return (
        f"tensor '{tensor}': the model file's shape is {model_text}, the config's dims give "
        f"{config_text}{batch_note}; write dims: [ {dims} ], or leave the tensor out of "
        f"{CONFIG_FILENAME} and auto-complete fills it from the model file"
    )
