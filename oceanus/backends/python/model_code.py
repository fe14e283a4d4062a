"""The model's own code as a stub runs it, by the rules of Triton's stub: import model.py, run
its coroutines on the stub's asyncio loop, check what `execute` returns, and print its
exceptions the way the stub does."""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import os
import sys
import threading
import traceback
import types
from typing import Any

import oceanus.ipc
from oceanus.backends.python.pb.requests import InferenceRequest, InferenceResponse


class BackendError(Exception):
    """A rule of the backend was broken (the message is Triton's, without a traceback)."""


def describe(exc: BaseException) -> str:
    """A BackendError's own text, anything else as `format_exception` prints it."""
    return str(exc) if isinstance(exc, BackendError) else format_exception(exc)


def format_exception(exc: BaseException) -> str:
    """`<Type>: <message>` and the frames of the model's code, innermost first, as Triton's
    stub prints them (`\n\nAt:\n  <file>(<line>): <function>\n`)."""
    text = f"{type(exc).__name__}: {exc}"
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if not _is_plumbing(frame.filename)
    ]
    if not frames:
        return text
    lines = [f"  {frame.filename}({frame.lineno}): {frame.name}" for frame in reversed(frames)]
    return text + "\n\nAt:\n" + "\n".join(lines) + "\n"


_PLUMBING = tuple(
    os.path.dirname(os.path.abspath(path)) + os.sep
    for path in (
        __file__,
        oceanus.ipc.__file__,
        asyncio.__file__,
        concurrent.futures.__file__,
        importlib.util.__file__,
    )
)


def _is_plumbing(filename: str) -> bool:
    """Frames of the stub, asyncio or the import system, which the model's author did not
    write."""
    return filename.startswith("<frozen") or os.path.abspath(filename).startswith(_PLUMBING)


def load_module(model_path: str) -> types.ModuleType:
    """Import model.py as `model`, its folder first on sys.path (as Triton's stub does)."""
    folder = os.path.dirname(model_path)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location("model", model_path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {model_path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["model"] = module
    spec.loader.exec_module(module)
    return module


def model_class(module: types.ModuleType, model_path: str) -> Any:
    found = getattr(module, "TritonPythonModel", None)
    if found is None:
        raise AttributeError(f"Python model {model_path} does not define class 'TritonPythonModel'")
    return found


class AsyncRunner:
    """The asyncio loop `async def` methods run on, in its own thread (started on first use)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def run(self, coroutine: Any) -> concurrent.futures.Future[Any]:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="asyncio", daemon=True).start()
                self._loop = loop
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def stop(self) -> None:
        """End the loop's thread (an in-process model's unload; a stub just exits)."""
        with self._lock:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._loop = None


def check_returned(
    returned: Any, requests: list[InferenceRequest], instance_name: str, decoupled: bool
) -> list[InferenceResponse] | None:
    """What a (non-async) `execute` returned, checked by Triton's rules: None (responses go
    through the response senders) or one InferenceResponse per request."""
    if decoupled:
        if returned is not None:
            raise BackendError(
                f"Python model '{instance_name}' is using the decoupled mode and the "
                "execute function must return None."
            )
        return None
    if returned is None:
        return None
    if not isinstance(returned, list):
        raise BackendError(f"Expected a list in the execute return, found type '{type(returned)}'.")
    if len(returned) != len(requests):
        raise BackendError(
            "Number of InferenceResponse objects do not match the number of "
            f"InferenceRequest objects. InferenceRequest(s) size is:{len(requests)}, and "
            f"InferenceResponse(s) size is:{len(returned)}\n"
        )
    for response in returned:
        if not isinstance(response, InferenceResponse):
            raise BackendError(
                "Expected an 'InferenceResponse' object in the execute function return "
                f"list, found type '{type(response)}'."
            )
    return returned
