"""Files created in a folder (/dev/shm), seen with inotify (Linux): the one-off files a message
takes when it does not fit a ring are unlinked as soon as they are mapped, so listing the folder
cannot count them. For tests and benchmarks (bench/python_backend.py), not the serving path."""

from __future__ import annotations

import ctypes
import os
import struct

IN_CREATE = 0x100
IN_NONBLOCK = 0o4000
_EVENT = struct.Struct("iIII")


class ShmWatch:
    """Names created in `folder` from now on (`created()` drains them)."""

    def __init__(self, folder: str = "/dev/shm") -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._fd = libc.inotify_init1(IN_NONBLOCK)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        if libc.inotify_add_watch(self._fd, folder.encode(), IN_CREATE) < 0:
            raise OSError(ctypes.get_errno(), "inotify_add_watch")

    def created(self) -> list[str]:
        """Names created since the last call."""
        names: list[str] = []
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return names
            offset = 0
            while offset < len(data):
                _, _, _, length = _EVENT.unpack_from(data, offset)
                start = offset + _EVENT.size
                names.append(data[start : start + length].rstrip(b"\0").decode())
                offset = start + length

    def close(self) -> None:
        os.close(self._fd)
