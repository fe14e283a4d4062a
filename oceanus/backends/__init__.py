"""Backends behind one interface (`base.Backend`), chosen by the config's `backend` field."""

from __future__ import annotations

from oceanus.backends.base import Backend, BackendInstance, InstanceSpec
from oceanus.core.errors import invalid_arg

__all__ = ["Backend", "BackendInstance", "InstanceSpec", "get_backend"]

_LOADED: dict[str, Backend] = {}


def get_backend(name: str) -> Backend:
    """The backend registered as `name`, imported on first use: unused frameworks cost nothing."""
    backend = _LOADED.get(name)
    if backend is not None:
        return backend
    if name == "onnxruntime":
        from oceanus.backends.onnxruntime import OnnxRuntimeBackend

        backend = OnnxRuntimeBackend()
    else:
        raise invalid_arg(f"unable to find backend '{name}'")
    _LOADED[name] = backend
    return backend
