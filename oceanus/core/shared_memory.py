"""Triton's system shared memory extension: registered regions, tensors read and written there.

A client creates a POSIX shared memory object (`shm_open` name, i.e. a file under /dev/shm), then
registers a window of it (key, offset, byte size) under a region name. Requests then name
`shared_memory_region` / `shared_memory_offset` / `shared_memory_byte_size` for an input (the
server reads the tensor there instead of from the request) or an output (the server writes the
tensor there and the response carries no data for it).

Regions are mapped with `os.open` + `mmap` (never `multiprocessing.shared_memory`: its resource
tracker could unlink the client's object). Inputs are read-only numpy views of the mapping (no
copy until the core assembles the batch); outputs are copied into it when the response is built.

A region is *in use* while a request that names it is queued or executing: unregistering it then
fails with Triton's text, as in Triton. Memory safety does not rest on that count: a mapping with
live views cannot be closed (`BufferError`), so a region unregistered while something still views
it is dropped from the registry and unmapped when its last view goes away.

CUDA shared memory needs CUDA IPC, which Oceanus does not have: its status lists no region and
registering fails with the text Triton gives on a machine without a usable CUDA driver.

Error texts are Triton 2.51's (src/shared_memory_manager.cc); where Triton answers a client's
mistake with INTERNAL (HTTP 500), these are INVALID_ARG (400) with the same words.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import mmap
import os
import stat
from dataclasses import dataclass
from typing import Any

from oceanus.core.errors import ErrorCode, InferenceServerError, invalid_arg, not_found

log = logging.getLogger("oceanus.core.shared_memory")

SHM_DIR = "/dev/shm"
_U64 = 1 << 64
_NAME_MAX = 255

CUDA_REGISTER_FAILED = "failed to register shared memory region: invalid args"


def as_unsigned(value: int) -> int:
    """An int64 protocol field as the size_t Triton reads it (negative values wrap around)."""
    return value % _U64


def _path_of(key: str) -> str | None:
    """The file `shm_open(key)` opens (glibc: leading slashes dropped, no other slash), or None
    when shm_open would refuse the name."""
    name = key.lstrip("/")
    if not name or "/" in name or "\0" in name or name in (".", "..") or len(name) > _NAME_MAX:
        return None
    return os.path.join(SHM_DIR, name)


class Region:
    """One registered system shared memory region: `byte_size` bytes of the object `key` from
    `offset`, mapped read-write."""

    __slots__ = ("_base", "_mmap", "_view", "byte_size", "key", "name", "offset", "users")

    def __init__(
        self, name: str, key: str, offset: int, byte_size: int, mapping: mmap.mmap, base: int
    ):
        self.name = name
        self.key = key
        self.offset = offset
        self.byte_size = byte_size
        self._mmap = mapping
        self._base = (
            base  # where the region starts in the mapping (the mapping starts page-aligned)
        )
        self._view: memoryview | None = memoryview(mapping)[base : base + byte_size]
        self.users = 0  # requests queued or executing that name this region

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "offset": self.offset,
            "byte_size": self.byte_size,
        }

    def view(self, offset: int, byte_size: int) -> memoryview:
        """`byte_size` bytes at `offset` into the region (bounds already checked)."""
        assert self._view is not None
        return self._view[offset : offset + byte_size]

    def close(self) -> None:
        """Unmap, or leave the unmapping to the garbage collector while views are alive."""
        view, self._view = self._view, None
        if view is not None:
            view.release()
        try:
            self._mmap.close()
        except BufferError:
            log.debug("shared memory region '%s' is unmapped once its last view is gone", self.name)


@dataclass(slots=True)
class ShmTarget:
    """Where an output goes: `byte_size` bytes at `offset` into a region."""

    region: Region
    offset: int
    byte_size: int
    view: memoryview


class SharedMemoryManager:
    """The registered regions of one server (used on the event loop only)."""

    def __init__(self) -> None:
        self._regions: dict[str, Region] = {}

    # ---- registration -----------------------------------------------------------------------

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Map `byte_size` bytes of the shared memory object `key` from `offset` as `name`."""
        if name in self._regions:
            raise InferenceServerError(
                ErrorCode.ALREADY_EXISTS, f"shared memory region '{name}' already in manager"
            )
        path = _path_of(key)
        try:
            if path is None:
                raise FileNotFoundError(key)
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            log.debug("opening shared memory object '%s' failed: %s", key, exc)
            raise invalid_arg(f"Unable to open shared memory region: '{key}'") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise invalid_arg(f"Invalid shared memory region: '{key}'")
            if offset + byte_size > info.st_size:
                raise invalid_arg(f"failed to register shared memory region '{name}': invalid args")
            if byte_size == 0:  # mmap(2) refuses an empty mapping; Triton passes its words on
                raise invalid_arg(
                    f"failed to register shared memory region '{name}': unable to process address "
                    "spaceInvalid argument"
                )
            # The client's object may be sparse: take its pages now, or a full /dev/shm would
            # kill the server by SIGBUS when it writes an output there (the contents are kept).
            try:
                os.posix_fallocate(fd, offset, byte_size)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:  # a file system without fallocate: map as before
                    log.debug("reserving shared memory object '%s' failed: %s", key, exc)
                else:
                    raise invalid_arg(
                        f"failed to register shared memory region '{name}': /dev/shm has no "
                        f"room for its {byte_size} bytes (the shared memory object is sparse and "
                        "the file system is full)"
                    ) from None
            # mmap offsets must be page-aligned: map from the page holding `offset`.
            base = offset % mmap.ALLOCATIONGRANULARITY
            try:
                mapping = mmap.mmap(
                    fd,
                    base + byte_size,
                    flags=mmap.MAP_SHARED,
                    prot=mmap.PROT_READ | mmap.PROT_WRITE,
                    offset=offset - base,
                )
            except OSError as exc:
                raise invalid_arg(
                    f"failed to register shared memory region '{name}': unable to process "
                    f"address space{exc.strerror}"
                ) from None
        finally:
            os.close(fd)
        self._regions[name] = Region(name, key, offset, byte_size, mapping, base)
        log.debug(
            "registered shared memory region '%s' (key '%s', offset %d, %d bytes)",
            name,
            key,
            offset,
            byte_size,
        )

    def status(self, name: str = "") -> list[dict[str, Any]]:
        """Every region (sorted by name, as Triton lists them), or the one named."""
        if not name:
            return [self._regions[n].status() for n in sorted(self._regions)]
        region = self._regions.get(name)
        if region is None:
            raise not_found(f"Unable to find system shared memory region: '{name}'")
        return [region.status()]

    def unregister(self, name: str) -> None:
        """Unmap `name` (nothing happens for a name that is not registered, as in Triton)."""
        region = self._regions.get(name)
        if region is None:
            return
        if region.users:
            raise invalid_arg(
                f"Cannot unregister shared memory region '{name}', it is currently in use."
            )
        del self._regions[name]
        region.close()

    def unregister_all(self) -> None:
        """Unmap every region not in use; name those in use in the error, as Triton does."""
        failed = []
        for name in sorted(self._regions):
            try:
                self.unregister(name)
            except InferenceServerError:
                failed.append(name)
        if failed:
            message = "Failed to unregister the following system shared memory regions: " + "".join(
                f"{name} ," for name in failed
            )
            log.error("%s", message)
            raise invalid_arg(message)

    def close(self) -> None:
        """At shutdown: unmap everything, in use or not."""
        regions, self._regions = self._regions, {}
        for region in regions.values():
            region.close()

    # ---- CUDA shared memory (never available) ---------------------------------------------------

    def cuda_status(self, name: str = "") -> list[dict[str, Any]]:
        if not name:
            return []
        if name in self._regions:
            raise not_found(
                f"The region named '{name}' is registered as system shared memory, not CUDA "
                "shared memory"
            )
        raise not_found(f"Unable to find cuda shared memory region: '{name}'")

    def register_cuda(self, name: str) -> None:
        if name in self._regions:
            raise InferenceServerError(
                ErrorCode.ALREADY_EXISTS, f"shared memory region '{name}' already in manager"
            )
        log.error("failed to open CUDA IPC handle: Oceanus has no CUDA shared memory support")
        raise invalid_arg(CUDA_REGISTER_FAILED)

    # ---- tensors ------------------------------------------------------------------------------

    def _region(self, name: str, offset: int, byte_size: int) -> Region:
        """The region, after Triton's bounds checks of a tensor's offset and byte size."""
        region = self._regions.get(name)
        if region is None:
            raise not_found(f"Unable to find shared memory region: '{name}'")
        if offset >= region.byte_size:
            raise invalid_arg(f"Invalid offset for shared memory region: '{name}'")
        # Triton 2.51 computes offset + byte_size - 1 unsigned: 0 bytes at offset 0 fail too.
        if (offset + byte_size - 1) % _U64 >= region.byte_size:
            raise invalid_arg(f"Invalid offset + byte size for shared memory region: '{name}'")
        return region

    def input_view(self, name: str, offset: int, byte_size: int, uses: list[Region]) -> memoryview:
        """A read-only view of an input's bytes; the region is added to the request's `uses`."""
        region = self._region(name, offset, byte_size)
        uses.append(region)
        return region.view(offset, byte_size).toreadonly()

    def output_target(
        self, name: str, offset: int, byte_size: int, uses: list[Region]
    ) -> ShmTarget:
        region = self._region(name, offset, byte_size)
        uses.append(region)
        return ShmTarget(region, offset, byte_size, region.view(offset, byte_size))

    @staticmethod
    def hold(regions: list[Region], future: asyncio.Future[Any]) -> None:
        """Mark the regions in use until `future` (the request's) is done."""
        for region in regions:
            region.users += 1

        def release(_: asyncio.Future[Any]) -> None:
            for region in regions:
                region.users -= 1

        future.add_done_callback(release)


def write_output(target: ShmTarget, name: str, data: bytes | memoryview) -> None:
    """Copy an output's bytes into its region (Triton's text when they do not fit)."""
    size = len(data) if isinstance(data, bytes) else data.nbytes
    if size > target.byte_size:
        raise invalid_arg(
            f"shared memory size specified with the request for output '{name}' "
            f"({target.byte_size} bytes) should be at least {size} bytes to hold the results"
        )
    target.view[:size] = data


# The manager of a frontend that has none: every region name is unknown.
NO_REGIONS = SharedMemoryManager()
