"""Oceanus: an inference server that speaks NVIDIA Triton's protocols."""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """`oceanus.Server`, the in-process server (docs/embedded.md), imported on first use: the
    server's worker and stub processes import this package and must not pay for it. Imported
    by name, not statement, so the layer contracts (pyproject.toml) do not see every module that
    reads `oceanus.__version__` as importing the in-process API."""
    if name == "Server":
        return importlib.import_module("oceanus.embedded").Server
    raise AttributeError(f"module 'oceanus' has no attribute '{name}'")
