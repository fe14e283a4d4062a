"""Triton's `--backend-config=python,<key>=<value>` options, mapped onto this backend.

- `shm-default-byte-size`: Triton's initial shared-memory region per stub (default 1 MiB); here
  what the stub's two rings (one per direction) take together at start: half each.
- `shm-growth-byte-size`: the step by which Triton grows that region when a message does not fit
  (default 1 MiB); here the step by which the ring that a message does not fit grows (its writer
  moves to a larger segment, and back to a smaller one after a quiet spell: oceanus/ipc/rings.py).
  0: the rings never grow, a message bigger than the free part of a ring takes a one-off file.
- `stub-timeout-seconds`: how long Triton waits on a stub's answers at start and shutdown
  (default 30); here how long an unload waits for finalize() before the stub is killed.
Unknown keys are ignored, as Triton's Python backend ignores them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from oceanus.core.errors import InferenceServerError, invalid_arg

BACKEND = "python"
# Triton's defaults for both: a stub's shared memory starts at 1 MiB and grows by 1 MiB.
DEFAULT_SHM_BYTES = 1 << 20
DEFAULT_GROWTH_BYTES = 1 << 20
# Below this the two rings cannot hold one small batch's tensors and their framing.
MIN_SHM_BYTES = 64 << 10


@dataclass(frozen=True)
class PythonOptions:
    shm_bytes: int = DEFAULT_SHM_BYTES  # both rings together, at start
    growth_bytes: int = DEFAULT_GROWTH_BYTES  # 0: the rings never grow
    stub_timeout_s: float = 30.0  # Triton's default

    @property
    def ring_bytes(self) -> int:
        """Each ring's size at start (the stub's two rings share `shm_bytes`)."""
        return self.shm_bytes // 2


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
        shm_bytes=_size(settings, "shm-default-byte-size", DEFAULT_SHM_BYTES, MIN_SHM_BYTES),
        growth_bytes=_size(settings, "shm-growth-byte-size", DEFAULT_GROWTH_BYTES, 0),
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
