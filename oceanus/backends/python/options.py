"""Triton's `--backend-config=python,<key>=<value>` options, mapped onto this backend.

- `shm-default-byte-size`: Triton's initial shared-memory region per stub; here the size of each
  of the stub's two rings (one per direction). Unset, the rings keep our 8 MiB default (Triton's
  default region is 1 MiB but grows; ours cannot).
- `shm-growth-byte-size`: how Triton grows that region when a message does not fit. Our rings
  are fixed once both processes map them, so it is checked and otherwise unused: a message
  bigger than the free part of a ring goes through a one-off file. Size the rings instead.
- `stub-timeout-seconds`: how long Triton waits on a stub's answers at start and shutdown
  (default 30); here how long an unload waits for finalize() before the stub is killed.
Unknown keys are ignored, as Triton's Python backend ignores them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from oceanus.core.errors import InferenceServerError, invalid_arg
from oceanus.ipc.rings import DEFAULT_RING_BYTES

BACKEND = "python"
# Below this a ring cannot hold one small batch's tensors and their framing.
MIN_RING_BYTES = 64 << 10


@dataclass(frozen=True)
class PythonOptions:
    ring_bytes: int = DEFAULT_RING_BYTES
    growth_bytes: int = 1 << 20  # Triton's default; unused (see above)
    stub_timeout_s: float = 30.0  # Triton's default


def backend_settings(entries: Iterable[str], backend: str) -> dict[str, str]:
    """`backend,key=value` strings (the --backend-config flag's) -> {key: value} of one backend."""
    found: dict[str, str] = {}
    for entry in entries:
        name, _, setting = entry.partition(",")
        key, sep, value = setting.partition("=")
        if name == backend and sep:
            found[key] = value
    return found


def parse(settings: dict[str, str]) -> PythonOptions:
    return PythonOptions(
        ring_bytes=_size(settings, "shm-default-byte-size", DEFAULT_RING_BYTES, MIN_RING_BYTES),
        growth_bytes=_size(settings, "shm-growth-byte-size", 1 << 20, 0),
        stub_timeout_s=float(_size(settings, "stub-timeout-seconds", 30, 1)),
    )


def _size(settings: dict[str, str], key: str, default: int, minimum: int) -> int:
    text = settings.get(key)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise _bad(key, text, minimum) from None
    if value < minimum:
        raise _bad(key, text, minimum)
    return value


def _bad(key: str, text: str, minimum: int) -> InferenceServerError:
    return invalid_arg(f"--backend-config={BACKEND},{key}={text}: expected an integer >= {minimum}")
