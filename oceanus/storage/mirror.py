"""A local mirror of a remote model repository, brought up to date on demand (blocking).

Each `sync()` lists the remote repository once, downloads the objects that are new or changed
(by size and ETag/generation), each into a temporary file renamed into place so no reader ever
sees half a file, and deletes the files it had downloaded that are gone remotely. Unchanged files
keep their modification time, so the core's poll fingerprint sees only real changes.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from oceanus.storage.locations import RemoteLocation, RepositoryError, is_remote, parse_location

log = logging.getLogger("oceanus.storage")

# Info keys that change when an object's content does, by filesystem (s3fs, gcsfs, adlfs).
_VERSION_KEYS = ("ETag", "etag", "generation", "md5Hash", "LastModified", "last_modified")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError):
        return f"not found ({exc})"
    if isinstance(exc, PermissionError):
        return f"access denied, check the credentials ({exc})"
    return f"{type(exc).__name__}: {exc}"


class Mirror:
    """One remote repository and the local folder that mirrors it."""

    def __init__(self, location: RemoteLocation, local: Path) -> None:
        self.location = location
        self.local = local
        self._fs = location.filesystem()
        self._lock = threading.Lock()  # explicit loads may sync from several loader threads
        self._have: dict[str, tuple[Any, ...]] = {}  # relative path -> remote fingerprint

    def sync(self) -> bool:
        """Bring the local folder up to date; whether anything changed. RepositoryError (naming
        the URL) when the repository cannot be listed or a file cannot be fetched."""
        with self._lock:
            listing = self._list()
            changed = False
            for relative, (remote, fingerprint) in sorted(listing.items()):
                if relative.endswith("/"):  # a "folder" placeholder object
                    (self.local / relative).mkdir(parents=True, exist_ok=True)
                    continue
                if self._have.get(relative) == fingerprint:
                    continue
                self._fetch(remote, relative)
                self._have[relative] = fingerprint
                changed = True
            for relative in [r for r in self._have if r not in listing]:
                (self.local / relative).unlink(missing_ok=True)
                del self._have[relative]
                self._prune(Path(relative).parent)
                changed = True
            return changed

    def _list(self) -> dict[str, tuple[str, tuple[Any, ...]]]:
        """relative path -> (remote path, fingerprint) for every object under the location."""
        root = self.location.path.rstrip("/")
        try:
            self._fs.invalidate_cache()
            if not self._fs.exists(root):
                raise FileNotFoundError(f"'{root}' does not exist")
            found = self._fs.find(root, detail=True, withdirs=False)
        except RepositoryError:
            raise
        except Exception as exc:
            raise RepositoryError(
                f"failed to read model repository '{self.location.url}': {_describe(exc)}"
            ) from None
        listing: dict[str, tuple[str, tuple[Any, ...]]] = {}
        for remote, info in found.items():
            name = remote.rstrip("/")
            if not name.startswith(root + "/"):
                continue
            relative = name[len(root) + 1 :] + ("/" if info.get("type") == "directory" else "")
            fingerprint = (info.get("size"), *(str(info.get(k)) for k in _VERSION_KEYS))
            listing[relative] = (remote, fingerprint)
        return listing

    def _fetch(self, remote: str, relative: str) -> None:
        target = self.local / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=".oceanus-download-")
        os.close(handle)
        try:
            self._fs.get_file(remote, temporary)
            os.replace(temporary, target)
        except Exception as exc:
            Path(temporary).unlink(missing_ok=True)
            raise RepositoryError(
                f"failed to read model repository '{self.location.url}': "
                f"fetching '{relative}': {_describe(exc)}"
            ) from None

    def _prune(self, folder: Path) -> None:
        """Remove folders left empty by deletions, up to the mirror's root."""
        while folder.parts:
            path = self.local / folder
            try:
                path.rmdir()
            except OSError:
                return
            folder = folder.parent


class RepositorySet:
    """The `--model-repository` values as local folders: local ones as they are, remote ones
    mirrored. `refresh()` syncs the mirrors (before a poll or an explicit load)."""

    def __init__(self, folders: list[Path], mirrors: list[Mirror]) -> None:
        self.folders = folders
        self.mirrors = mirrors

    @classmethod
    def open(cls, values: Sequence[str]) -> RepositorySet:
        """Mirror every remote repository once (blocking); RepositoryError names the URL."""
        folders: list[Path] = []
        mirrors: list[Mirror] = []
        for value in values:
            if not is_remote(value):
                folders.append(Path(value).expanduser().resolve())
                continue
            location = parse_location(value)
            mirror = Mirror(location, _local_folder(location))
            mirror.sync()
            log.info("model repository %s mirrored into %s", value, mirror.local)
            mirrors.append(mirror)
            folders.append(mirror.local)
        return cls(folders, mirrors)

    def refresh(self) -> None:
        """Sync every mirror; a failure is logged and the last good copy keeps serving."""
        for mirror in self.mirrors:
            try:
                if mirror.sync():
                    log.info("model repository %s changed", mirror.location.url)
            except RepositoryError as exc:
                log.error("%s", exc)


def _local_folder(location: RemoteLocation) -> Path:
    """Where a location is mirrored: under its TRITON_*_MOUNT_DIRECTORY (which must exist), else
    in a temporary folder removed at exit."""
    mount = os.environ.get(location.mount_variable)
    if mount:
        root = Path(mount)
        if not root.is_dir():
            raise RepositoryError(
                f"model repository '{location.url}': {location.mount_variable}={mount} "
                "is not an existing folder"
            )
    else:
        root = Path(tempfile.mkdtemp(prefix="oceanus-repository-"))
        atexit.register(_remove(root))
    local = root / location.path
    local.mkdir(parents=True, exist_ok=True)
    return local


def _remove(root: Path) -> Callable[[], None]:
    return lambda: shutil.rmtree(root, ignore_errors=True)
