"""Model lifecycle: load, reload without downtime, unload, and polling the repositories.

Loads run off the event loop on the core's loader threads, several at a time. A reload builds the
new versions beside the old ones; only once they are READY do requests switch to them, and the
old versions are unloaded after their queued and in-flight requests complete, so a reload under
traffic fails no request. One lock per model name keeps loads and unloads of a model in order.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.core import repository
from oceanus.core.errors import InferenceServerError, invalid_arg
from oceanus.core.instance import InstanceWorker
from oceanus.core.model import ModelEntry, ModelState, ModelVersion

log = logging.getLogger("oceanus.core.models")

RunBlocking = Callable[..., Awaitable[Any]]
# How often a retiring version is checked for remaining requests.
_DRAIN_POLL_S = 0.005


class ModelManager:
    def __init__(
        self,
        repositories: list[Path],
        models: dict[str, ModelEntry],
        run_blocking: RunBlocking,
        autocomplete: bool,
        gpu_count: int,
    ) -> None:
        self.repositories = repositories
        self.models = models
        self._run_blocking = run_blocking
        self._autocomplete = autocomplete
        self._gpu_count = gpu_count
        self._locks: dict[str, asyncio.Lock] = {}
        self._fingerprints: dict[str, tuple[Any, ...]] = {}
        self._override_dirs: dict[str, Path] = {}

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    # ---- loading ----------------------------------------------------------------------------

    async def load(
        self,
        name: str,
        config_json: str | None = None,
        files: dict[str, bytes] | None = None,
    ) -> ModelEntry:
        """Load or reload a model; raises with the reason when no version becomes ready."""
        async with self._lock(name):
            return await self._load_locked(name, config_json, files)

    async def _load_locked(
        self, name: str, config_json: str | None, files: dict[str, bytes] | None
    ) -> ModelEntry:
        override = _parse_override(name, config_json) if config_json is not None else None
        if files:
            if override is None:
                raise invalid_arg(
                    f"failed to load '{name}': load parameters with model files ('file:...') "
                    "require the 'config' parameter"
                )
            folder = await self._run_blocking(self._write_override, name, override, files)
        else:
            folders = await self._run_blocking(repository.scan, self.repositories)
            folder = folders.get(name)
            if folder is None:
                raise invalid_arg(f"failed to load '{name}', failed to poll from model repository")
        entry = self.models.get(name)
        if entry is None:
            entry = self.models[name] = ModelEntry(name, folder)
        serving = {v: mv for v, mv in entry.versions.items() if mv.ready}
        try:
            config, backend, paths = await self._run_blocking(
                repository.prepare_config, folder, self._autocomplete, self._gpu_count, override
            )
            if not paths:
                raise invalid_arg(
                    "at least one version must be available under the version policy of "
                    f"model '{name}'"
                )
        except InferenceServerError as exc:
            log.error("failed to load '%s': %s", name, exc.message)
            if not serving:
                entry.error = exc.message
            raise InferenceServerError(
                exc.code, f"failed to load '{name}': {exc.message}"
            ) from None
        fresh = await self._load_versions(name, config, backend, paths)
        ready = {v: mv for v, mv in fresh.items() if mv.ready}
        if not ready and serving:
            reasons = "; ".join(mv.reason for mv in fresh.values())
            log.error("reload of '%s' failed, the loaded versions keep serving: %s", name, reasons)
            raise invalid_arg(f"failed to load '{name}': {reasons}")
        retiring = [mv for mv in entry.versions.values() if mv.state is ModelState.READY]
        entry.folder, entry.config, entry.error = folder, config, ""
        entry.versions = dict(sorted(fresh.items()))
        self._fingerprints[name] = await self._run_blocking(_fingerprint, folder)
        await asyncio.gather(*(self._retire(mv, "unloaded") for mv in retiring))
        if not ready:
            reasons = "; ".join(mv.reason for mv in fresh.values())
            raise invalid_arg(f"failed to load '{name}': {reasons}")
        return entry

    async def _load_versions(
        self, name: str, config: mc.ModelConfig, backend: Any, paths: dict[int, Path]
    ) -> dict[int, ModelVersion]:
        loop = asyncio.get_running_loop()
        fresh = {v: ModelVersion(name, v, config, path) for v, path in paths.items()}
        results = await asyncio.gather(
            *(
                self._run_blocking(
                    repository.load_version, config, backend, v, path, self._gpu_count
                )
                for v, path in paths.items()
            )
        )
        batched = config.max_batch_size > 0
        for loaded in results:
            version = fresh[loaded.version]
            version.load_duration_s = loaded.load_seconds
            if loaded.error is not None:
                version.state = ModelState.UNAVAILABLE
                version.reason = loaded.error.message
                log.error(
                    "failed to load '%s' version %d: %s", name, loaded.version, version.reason
                )
                continue
            workers = [
                InstanceWorker(spec, instance, batched, loop) for spec, instance in loaded.instances
            ]
            version.start(workers)
            log.info("successfully loaded '%s' version %d", name, loaded.version)
        return fresh

    def _write_override(self, name: str, config: mc.ModelConfig, files: dict[str, bytes]) -> Path:
        """A private model folder made of the files a load request supplied (blocking)."""
        root = Path(tempfile.mkdtemp(prefix=f"oceanus-{name}-"))
        folder = root / name
        folder.mkdir()
        for relative, content in files.items():
            target = (folder / relative).resolve()
            if folder.resolve() not in target.parents:
                shutil.rmtree(root, ignore_errors=True)
                raise invalid_arg(
                    f"failed to load '{name}': file path '{relative}' leaves the model"
                )
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        previous = self._override_dirs.pop(name, None)
        self._override_dirs[name] = root
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)
        return folder

    # ---- unloading --------------------------------------------------------------------------

    async def unload(self, name: str) -> None:
        async with self._lock(name):
            entry = self.models.get(name)
            if entry is None:
                raise invalid_arg(f"failed to unload '{name}', no version is available")
            await asyncio.gather(
                *(self._retire(mv, "unloaded") for mv in entry.versions.values() if mv.ready)
            )
            self._fingerprints.pop(name, None)

    async def _retire(self, version: ModelVersion, reason: str) -> None:
        """Stop routing to a version, let its queued and running requests finish, then free it."""
        version.state = ModelState.UNLOADING
        scheduler = version.scheduler
        while scheduler is not None and scheduler.pending_count:
            await asyncio.sleep(_DRAIN_POLL_S)
        await self._run_blocking(version.stop)
        version.reason = reason
        log.info("successfully unloaded '%s' version %d", version.name, version.version)

    async def unload_all(self) -> None:
        await asyncio.gather(*(self.unload(name) for name in list(self.models)))
        for root in self._override_dirs.values():
            shutil.rmtree(root, ignore_errors=True)

    # ---- polling ----------------------------------------------------------------------------

    async def poll_once(self) -> None:
        """Load new and changed models, unload removed ones (--model-control-mode=poll)."""
        folders = await self._run_blocking(repository.scan, self.repositories)
        for name, folder in folders.items():
            fingerprint = await self._run_blocking(_fingerprint, folder)
            if self._fingerprints.get(name) == fingerprint:
                continue
            # Remembered before loading, so a model that fails is retried only once it changes.
            self._fingerprints[name] = fingerprint
            try:
                await self.load(name)
            except InferenceServerError as exc:
                log.error("poll: %s", exc.message)
        for name in list(self.models):
            removed = name not in folders and name not in self._override_dirs
            if removed and any(mv.ready for mv in self.models[name].versions.values()):
                log.info("poll: '%s' was removed from the repository; unloading it", name)
                await self.unload(name)

    async def poll_forever(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.poll_once()
            except Exception:  # polling must outlive one bad scan
                log.exception("repository poll failed")


def _parse_override(name: str, config_json: str) -> mc.ModelConfig:
    config = mc.ModelConfig()
    try:
        json_format.Parse(config_json, config)
    except json_format.ParseError as exc:
        raise invalid_arg(f"failed to load '{name}': failed to parse 'config': {exc}") from None
    return config


def _fingerprint(folder: Path) -> tuple[Any, ...]:
    """What poll mode compares: every file's path, size and modification time (blocking)."""
    items = []
    for path in sorted(folder.rglob("*")):
        try:
            stat = path.stat()
        except OSError:
            continue
        items.append((str(path.relative_to(folder)), stat.st_size, stat.st_mtime_ns))
    return tuple(items)


def decode_files(name: str, parameters: dict[str, Any]) -> dict[str, bytes]:
    """`file:<version>/<name>` load parameters (base64) -> relative path -> bytes."""
    files: dict[str, bytes] = {}
    for key, value in parameters.items():
        if not key.startswith("file:"):
            continue
        try:
            files[key[len("file:") :]] = base64.b64decode(value, validate=True)
        except (ValueError, TypeError):
            raise invalid_arg(
                f"failed to load '{name}': parameter '{key}' is not valid base64"
            ) from None
    return files
