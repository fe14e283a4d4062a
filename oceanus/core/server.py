"""The protocol-agnostic server core: the models it serves and the calls every frontend makes.

Frontends translate their wire format into these calls and back; nothing here knows HTTP or gRPC.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from oceanus import __version__
from oceanus.core import repository
from oceanus.core.errors import InferenceServerError, invalid_arg, not_found, unavailable
from oceanus.core.instance import InstanceWorker
from oceanus.core.model import ModelState, ModelVersion
from oceanus.core.types import InferRequest, InferResponse

log = logging.getLogger("oceanus.core")

SERVER_NAME = "oceanus"


@dataclass
class CoreOptions:
    repositories: list[Path]
    autocomplete: bool = True
    strict_readiness: bool = True
    load_threads: int = 4
    # Extensions the running frontends really implement, listed by server metadata.
    extensions: list[str] = field(default_factory=list)


@dataclass
class ModelEntry:
    """A model folder and what became of it: its versions, or why it failed."""

    name: str
    folder: Path
    config: mc.ModelConfig | None = None
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    error: str = ""

    def highest_ready(self) -> ModelVersion | None:
        for version in sorted(self.versions, reverse=True):
            if self.versions[version].ready:
                return self.versions[version]
        return None


def _gpu_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:
        return 0


class ServerCore:
    def __init__(self, options: CoreOptions) -> None:
        self.options = options
        self.models: dict[str, ModelEntry] = {}
        self._gpu_count = _gpu_count()
        self._executor = ThreadPoolExecutor(
            max_workers=max(1, options.load_threads), thread_name_prefix="oceanus-load"
        )
        self.live = False
        self._shutting_down = False

    # ---- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Scan the repositories and load every model (several at a time, off the loop)."""
        folders = await self._run_blocking(repository.scan, self.options.repositories)
        self.live = True
        await asyncio.gather(*(self.load_model(name, folder) for name, folder in folders.items()))

    async def load_model(self, name: str, folder: Path) -> ModelEntry:
        entry = self.models.setdefault(name, ModelEntry(name, folder))
        loop = asyncio.get_running_loop()
        try:
            config, backend, versions = await self._run_blocking(
                repository.prepare_config, folder, self.options.autocomplete, self._gpu_count
            )
        except InferenceServerError as exc:
            entry.error = exc.message
            log.error("failed to load '%s': %s", name, exc.message)
            return entry
        entry.config = config
        if not versions:
            entry.error = (
                f"at least one version must be available under the version policy of model '{name}'"
            )
            log.error("failed to load '%s': %s", name, entry.error)
        pending = {v: ModelVersion(name, v, config, path) for v, path in versions.items()}
        entry.versions.update(pending)
        results = await asyncio.gather(
            *(
                self._run_blocking(
                    repository.load_version, config, backend, v, path, self._gpu_count
                )
                for v, path in versions.items()
            )
        )
        batched = config.max_batch_size > 0
        for loaded in results:
            version = pending[loaded.version]
            version.load_duration_s = loaded.load_seconds
            if loaded.error is not None:
                version.state = ModelState.UNAVAILABLE
                version.reason = loaded.error.message
                log.error(
                    "failed to load '%s' version %d: %s", name, loaded.version, loaded.error.message
                )
                continue
            workers = [
                InstanceWorker(spec, instance, batched, loop) for spec, instance in loaded.instances
            ]
            version.start(workers)
            log.info("successfully loaded '%s' version %d", name, loaded.version)
        return entry

    async def _run_blocking(self, func: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, func, *args)

    def load_failures(self) -> list[tuple[str, str]]:
        """(model, reason) for every model or version that failed to load."""
        failures = []
        for entry in self.models.values():
            if entry.error:
                failures.append((entry.name, entry.error))
            for version in entry.versions.values():
                if version.state is ModelState.UNAVAILABLE:
                    failures.append((entry.name, version.reason))
        return failures

    async def shutdown(self) -> None:
        self._shutting_down = True
        versions = [v for e in self.models.values() for v in e.versions.values()]
        for version in versions:
            if version.scheduler is not None:
                version.scheduler.close()
        for version in versions:
            await self._run_blocking(version.stop)
        self._executor.shutdown(wait=False)

    # ---- health and metadata ----------------------------------------------------------------

    def ready(self) -> bool:
        if not self.live or self._shutting_down:
            return False
        if not self.options.strict_readiness:
            return True
        return all(
            not entry.error and all(v.ready for v in entry.versions.values())
            for entry in self.models.values()
        )

    def metadata(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": __version__, "extensions": self.options.extensions}

    def resolve(self, name: str, version: str = "") -> ModelVersion:
        """The model version a request names (the highest ready one when none is named)."""
        entry = self.models.get(name)
        if entry is None or (entry.error and not entry.versions):
            raise not_found(f"Request for unknown model: '{name}' is not found")
        if not version:
            found = entry.highest_ready()
            if found is None:
                raise not_found(f"Request for unknown model: '{name}' has no available versions")
            return found
        try:
            number = int(version)
        except ValueError:
            raise not_found(
                f"Request for unknown model: '{name}' version {version} is not found"
            ) from None
        model_version = entry.versions.get(number)
        if model_version is None:
            raise not_found(f"Request for unknown model: '{name}' version {number} is not found")
        if not model_version.ready:
            raise unavailable(
                f"Request for unknown model: '{name}' version {number} is not at ready state"
            )
        return model_version

    def model_ready(self, name: str, version: str = "") -> bool:
        try:
            return self.resolve(name, version).ready
        except InferenceServerError:
            return False

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        model_version = self.resolve(name, version)
        entry = self.models[name]
        versions = [str(v) for v in sorted(entry.versions) if entry.versions[v].ready]
        return model_version.metadata(versions)

    def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        return self.resolve(name, version).config

    # ---- inference --------------------------------------------------------------------------

    def infer(self, request: InferRequest) -> asyncio.Future[InferResponse]:
        """Validate and queue a request (on the loop); await the returned future."""
        if self._shutting_down:
            raise unavailable("Server is shutting down")
        return self.resolve(request.model_name, request.model_version).infer(request)

    # ---- statistics and repository ------------------------------------------------------------

    def statistics(self, name: str = "", version: str = "") -> list[dict[str, Any]]:
        if name:
            entry = self.models.get(name)
            if entry is None or entry.highest_ready() is None:
                raise invalid_arg(f"requested model '{name}' is not available")
            if version:
                found = entry.versions.get(int(version)) if version.isdigit() else None
                if found is None or not found.ready:
                    raise invalid_arg(
                        f"requested model version is not available for model '{name}'"
                    )
                chosen = [found]
            else:
                chosen = [v for _, v in sorted(entry.versions.items()) if v.ready]
        else:
            chosen = [
                v
                for entry in sorted(self.models.values(), key=lambda e: e.name)
                for _, v in sorted(entry.versions.items())
                if v.ready
            ]
        return [v.stats.as_dict(v.name, v.version_str) for v in chosen]

    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        index: list[dict[str, Any]] = []
        for entry in sorted(self.models.values(), key=lambda e: e.name):
            if entry.error and not entry.versions:
                if not ready_only:
                    index.append(
                        {"name": entry.name, "state": "UNAVAILABLE", "reason": entry.error}
                    )
                continue
            for number, version in sorted(entry.versions.items()):
                if ready_only and not version.ready:
                    continue
                index.append(
                    {
                        "name": entry.name,
                        "version": str(number),
                        "state": version.state.value,
                        "reason": version.reason,
                    }
                )
        return index
