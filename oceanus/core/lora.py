"""The LoRA adapters of every ready model, for the frontends: which adapter belongs to which
model (an OpenAI request's `model` may name an adapter), and loading and unloading them at run
time. The engines do the work (core.generation.LoraAdapters); this only finds them."""

from __future__ import annotations

from typing import Protocol

from oceanus.core.errors import invalid_arg, not_found
from oceanus.core.generation import LoraAdapters
from oceanus.core.model import ModelVersion


class _Core(Protocol):
    def ready_versions(self) -> list[ModelVersion]: ...


def lora_models(core: _Core) -> list[str]:
    """The ready models that serve LoRA adapters (latest version each), by name."""
    return sorted({v.name for v in core.ready_versions() if v.lora_adapters()})


def adapters(core: _Core) -> dict[str, tuple[str, str]]:
    """Adapter name -> (its model's name, its folder), over every ready model."""
    found: dict[str, tuple[str, str]] = {}
    for version in core.ready_versions():
        for engine in version.lora_adapters()[:1]:
            for name, path in engine.adapters().items():
                found.setdefault(name, (version.name, path))
    return found


def _target(core: _Core, model: str | None) -> list[ModelVersion]:
    versions = [v for v in core.ready_versions() if v.lora_adapters()]
    if model:
        versions = [v for v in versions if v.name == model]
        if not versions:
            raise not_found(f"The model `{model}` does not exist or does not serve LoRA adapters.")
    names = {v.name for v in versions}
    if not names:
        raise invalid_arg("No model serves LoRA adapters (model.json enable_lora).")
    if len(names) > 1:
        raise invalid_arg(
            f"Several models serve LoRA adapters ({', '.join(sorted(names))}): name one in "
            "'base_model_name'."
        )
    return versions


def load(core: _Core, name: str, path: str, model: str | None = None) -> None:
    """Load `name` into every instance of every ready version of the (one) LoRA model.
    Blocking: call it off the event loop."""
    if name in adapters(core):
        raise invalid_arg(f"The lora adapter '{name}' has already been loaded.")
    done: list[LoraAdapters] = []
    try:
        for version in _target(core, model):
            for engine in version.lora_adapters():
                engine.load(name, path)
                done.append(engine)
    except Exception:
        for engine in done:  # all or none
            engine.unload(name)
        raise


def unload(core: _Core, name: str) -> None:
    """Unload `name` from every engine that has it (their running requests finish)."""
    found = False
    for version in core.ready_versions():
        for engine in version.lora_adapters():
            if name in engine.adapters():
                engine.unload(name)
                found = True
    if not found:
        raise not_found(f"The lora adapter '{name}' cannot be found.")
