"""Shared memory as a budget: reserving pages up front, and what is reserved.

A file in /dev/shm (a tmpfs) is sparse: `ftruncate` promises pages it does not take, and the first
write to a page that no longer fits kills the writing process with SIGBUS (a container's
/dev/shm is 64 MB by default). So every file we map is reserved with `posix_fallocate` when it
is made: a short budget becomes ENOSPC where it can be handled (a load error, or a slower path
for one message), never a SIGBUS later. This module also keeps what the server's processes
hold (rings by owner) and how often a message had to take the slower path, for /metrics and
the status page.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading

_lock = threading.Lock()
_held: dict[str, int] = {}
_labels: dict[str, str] = {}  # owner -> what the status page calls it (a model's name)
_initial: dict[str, int] = {}  # owner -> what it held before its rings grew
_fallbacks = 0


class ShmFull(OSError):
    """/dev/shm cannot hold `needed` more bytes (`free` of `size` are left)."""

    def __init__(self, needed: int, free: int, size: int) -> None:
        super().__init__(errno.ENOSPC, "not enough shared memory")
        self.needed, self.free, self.size = needed, free, size


def shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else os.environ.get("TMPDIR", "/tmp")


def usage() -> tuple[int, int]:
    """(size, free) of the file system holding shm_dir(), in bytes."""
    stats = os.statvfs(shm_dir())
    return stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize


def reserve(fd: int, size: int) -> None:
    """Take the pages of the first `size` bytes of `fd` now; ShmFull if they do not fit."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
            raise
        total, free = usage()
        raise ShmFull(size, free, total) from None


def create_file(path: str, size: int, initial: tuple[int, bytes] | None = None) -> None:
    """A new shared file of `size` bytes, its pages reserved (and `initial` bytes written at an
    offset); ShmFull, with nothing left behind, when /dev/shm cannot hold it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)
        reserve(fd, size)
        if initial is not None:
            os.pwrite(fd, initial[1], initial[0])
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        raise
    finally:
        os.close(fd)


def map_file(path: str, size: int = 0) -> mmap.mmap:
    """Map a shared file (all of it with size 0); the descriptor is not kept."""
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def hold(owner: str, nbytes: int, label: str = "") -> None:
    """Count `nbytes` of shared memory as held by `owner` (a ring pair) until `drop(owner)`;
    `label` groups owners in `held_by_label` (the rings of one model's instances)."""
    with _lock:
        _held[owner] = _held.get(owner, 0) + nbytes
        _initial[owner] = _held[owner]
        if label:
            _labels[owner] = label


def resize(owner: str, nbytes: int) -> None:
    """`owner` now holds `nbytes` (its rings grew); nothing if it was dropped meanwhile."""
    with _lock:
        if owner in _held:
            _held[owner] = nbytes


def drop(owner: str) -> None:
    with _lock:
        _held.pop(owner, None)
        _labels.pop(owner, None)
        _initial.pop(owner, None)


def held_by_label() -> dict[str, dict[str, int]]:
    """Per label (owners held without one are left out), sorted by label: the bytes held now
    (`reserved_bytes`) and before any ring grew (`initial_bytes`)."""
    with _lock:
        totals: dict[str, dict[str, int]] = {}
        for owner, label in _labels.items():
            entry = totals.setdefault(label, {"reserved_bytes": 0, "initial_bytes": 0})
            entry["reserved_bytes"] += _held.get(owner, 0)
            entry["initial_bytes"] += _initial.get(owner, 0)
    return dict(sorted(totals.items()))


def reserved() -> int:
    """Bytes the rings of this process's owners hold."""
    with _lock:
        return sum(_held.values())


def count_fallback() -> None:
    """A message went through the control socket because no shared memory was left for it."""
    global _fallbacks
    with _lock:
        _fallbacks += 1


def fallbacks() -> int:
    with _lock:
        return _fallbacks


def human(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB"
