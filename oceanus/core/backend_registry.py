"""Backends by name: who serves a config's `backend` / `platform`, and which model file tells
auto-complete which backend a bare model folder needs.

The core holds a registry it is given; it never imports a backend. The server assembly
(`oceanus/main.py`) registers the built-in ones (`oceanus.backends.builtin`) and then
every backend other installed packages declare under the `oceanus.backends` entry point group
(docs/backends.md, "Adding a backend").
"""

from __future__ import annotations

import importlib.metadata
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from oceanus.core.backend import Backend
from oceanus.core.errors import InferenceServerError, invalid_arg
from oceanus.core.repository.load_hints import unknown_backend_hint

log = logging.getLogger("oceanus.core.backends")

ENTRY_POINT_GROUP = "oceanus.backends"


@dataclass(frozen=True)
class BackendSpec:
    """What a backend declares before its framework is imported."""

    name: str  # the config's `backend` value
    # Builds the backend; imports the framework, so it runs only when a model needs it. An
    # ImportError naming `framework` becomes an error that names `install` instead.
    create: Callable[[], Backend]
    # Model file names that identify the backend to auto-complete, most usual first, each with
    # the platform it implies ("" for none).
    model_files: Mapping[str, str] = field(default_factory=dict)
    # Triton platform names this backend serves (`platform: "onnxruntime_onnx"`).
    platforms: tuple[str, ...] = ()
    framework: str = ""  # the framework's top-level import name ("torch")
    label: str = ""  # its name for people ("PyTorch")
    install: str = ""  # how to install it, for the error: "pip install oceanus[pytorch]"


class BackendRegistry:
    """Registered backend specs, and the backends built from them on first use."""

    def __init__(self, specs: Iterable[BackendSpec] = ()) -> None:
        self._specs: dict[str, BackendSpec] = {}
        self._backends: dict[str, Backend] = {}
        self._lock = threading.Lock()  # loader threads may ask for a backend at once
        for spec in specs:
            self.register(spec)

    def register(self, spec: BackendSpec) -> None:
        """Add a backend; a later registration under the same name replaces an earlier one (a
        third-party package may override a built-in backend)."""
        if spec.name in self._specs:
            log.info("backend '%s' re-registered", spec.name)
        self._specs[spec.name] = spec
        self._backends.pop(spec.name, None)

    def register_entry_points(self, group: str = ENTRY_POINT_GROUP) -> list[str]:
        """Register every backend installed packages declare under `group`; each entry point
        names a `BackendSpec` (or a zero-argument callable returning one). Returns their names;
        a broken entry point is logged and skipped."""
        names: list[str] = []
        for entry in importlib.metadata.entry_points(group=group):
            try:
                target = entry.load()
                spec = target if isinstance(target, BackendSpec) else target()
                if not isinstance(spec, BackendSpec):
                    raise TypeError(f"{entry.value} is not a BackendSpec")
            except Exception as exc:
                log.error("backend entry point '%s' (%s) failed: %s", entry.name, entry.value, exc)
                continue
            self.register(spec)
            names.append(spec.name)
        return names

    def names(self) -> list[str]:
        return sorted(self._specs)

    def platforms(self) -> list[str]:
        """Every platform name a registered backend serves."""
        return sorted({platform for spec in self._specs.values() for platform in spec.platforms})

    def backend_for_platform(self, platform: str) -> str | None:
        for spec in self._specs.values():
            if platform in spec.platforms:
                return spec.name
        return None

    def guess(self, version_dirs: Iterable[Path]) -> tuple[str, str] | None:
        """(backend, platform or "") of the first registered model file found in a version
        folder, as Triton's auto-complete recognizes a model by its file name."""
        folders = list(version_dirs)
        for spec in self._specs.values():
            for file_name, platform in spec.model_files.items():
                if any((folder / file_name).exists() for folder in folders):
                    return spec.name, platform
        return None

    def get(self, name: str, model: str | None = None) -> Backend:
        """The backend registered as `name`, built on first use: unused frameworks cost
        nothing. A framework that is not installed is an error saying how to install it."""
        backend = self._backends.get(name)
        if backend is not None:
            return backend
        with self._lock:
            backend = self._backends.get(name)
            if backend is None:
                backend = self._backends[name] = self._create(name, model)
        return backend

    def _create(self, name: str, model: str | None) -> Backend:
        spec = self._specs.get(name)
        prefix = f"unable to load model '{model}': " if model else ""
        if spec is None:
            known = ", ".join(self.names()) or "none"
            raise invalid_arg(
                f"{prefix}unable to find backend '{name}' (known backends: {known})",
                hint=unknown_backend_hint(name, self.names(), self.platforms()),
            )
        try:
            return spec.create()
        except InferenceServerError:
            raise
        except (ImportError, OSError) as exc:  # OSError: the framework's shared library is broken
            hint = f": {spec.install}" if spec.install else ""
            missing = getattr(exc, "name", None) or ""
            framework = spec.framework
            if framework and (missing == framework or missing.startswith(framework + ".")):
                label = spec.label or framework
                raise invalid_arg(f"{prefix}backend '{name}' needs {label}{hint}") from None
            raise invalid_arg(
                f"{prefix}backend '{name}' needs {spec.label or framework or name}, which failed "
                f"to import ({exc}){hint}"
            ) from None
