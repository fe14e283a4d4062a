"""Backends behind one interface (`base.Backend`), chosen by the config's `backend` field."""

from __future__ import annotations

import asyncio
import importlib
from typing import TYPE_CHECKING, Any

from oceanus.core.errors import invalid_arg

if TYPE_CHECKING:
    from oceanus.backends.base import Backend, BackendInstance, InstanceSpec

__all__ = ["Backend", "BackendInstance", "InstanceSpec", "get_backend", "get_server", "set_server"]

_LOADED: dict[str, Backend] = {}


def __getattr__(name: str) -> Any:
    # base.py imports tritonclient (about half a second): the Python backend's worker processes
    # import this package without needing it, so it is imported on first use.
    if name in ("Backend", "BackendInstance", "InstanceSpec"):
        from oceanus.backends import base

        return getattr(base, name)
    raise AttributeError(f"module 'oceanus.backends' has no attribute '{name}'")


# The server core and its event loop, for backends that call back into the server (the Python
# backend's BLS requests). Set by ServerCore.start().
_SERVER: tuple[Any, asyncio.AbstractEventLoop | None] = (None, None)


def set_server(server: Any, loop: asyncio.AbstractEventLoop | None) -> None:
    global _SERVER
    _SERVER = (server, loop)


def get_server() -> tuple[Any, asyncio.AbstractEventLoop | None]:
    return _SERVER


# Backends whose framework is an optional dependency: backend name -> (module, class, the
# framework's top-level import name, its name for people, the pip extra that installs it).
OPTIONAL_BACKENDS: dict[str, tuple[str, str, str, str, str]] = {
    "pytorch": ("oceanus.backends.pytorch", "PyTorchBackend", "torch", "PyTorch", "pytorch"),
    "openvino": (
        "oceanus.backends.openvino",
        "OpenVinoBackend",
        "openvino",
        "OpenVINO",
        "openvino",
    ),
    # Imports TensorRT only when a model loads, so that a machine without a GPU is told so.
    "tensorrt": (
        "oceanus.backends.tensorrt",
        "TensorRTBackend",
        "tensorrt",
        "TensorRT",
        "tensorrt",
    ),
}


def get_backend(name: str, model: str | None = None) -> Backend:
    """The backend registered as `name`, imported on first use: unused frameworks cost nothing.

    A framework that is not installed is an error naming the pip extra that installs it (and
    the model, when given)."""
    backend = _LOADED.get(name)
    if backend is not None:
        return backend
    if name == "onnxruntime":
        from oceanus.backends.onnxruntime import OnnxRuntimeBackend

        backend = OnnxRuntimeBackend()
    elif name == "python":
        from oceanus.backends.python.backend import PythonBackend

        backend = PythonBackend()
    elif name in OPTIONAL_BACKENDS:
        backend = _optional(name, model)
    else:
        raise invalid_arg(f"unable to find backend '{name}'")
    _LOADED[name] = backend
    return backend


def _optional(name: str, model: str | None) -> Backend:
    module_name, class_name, framework, label, extra = OPTIONAL_BACKENDS[name]
    prefix = f"unable to load model '{model}': " if model else ""
    try:
        module = importlib.import_module(module_name)
    except (ImportError, OSError) as exc:  # OSError: the framework's shared library is broken
        missing = getattr(exc, "name", None) or ""
        if missing == framework or missing.startswith(framework + "."):
            raise invalid_arg(
                f"{prefix}backend '{name}' needs {label}: pip install oceanus[{extra}]"
            ) from None
        raise invalid_arg(
            f"{prefix}backend '{name}' needs {label}, which failed to import ({exc}): "
            f"pip install oceanus[{extra}]"
        ) from None
    backend: Backend = getattr(module, class_name)()
    return backend
