"""Model lifecycle: load, reload without downtime, unload, and polling the repositories.

Loads run off the event loop on the core's loader threads, several at a time. A reload builds the
new versions beside the old ones; only once they are READY do requests switch to them, and the
old versions are unloaded after their queued and in-flight requests complete, so a reload under
traffic fails no request. One lock per model name keeps loads and unloads of a model in order.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.core.backend import Backend, ServerHandle
from oceanus.core.backend_registry import BackendRegistry
from oceanus.core.clock import MONOTONIC, Clock
from oceanus.core.ensemble import steps as ensemble
from oceanus.core.errors import InferenceServerError, invalid_arg
from oceanus.core.model import ModelEntry, ModelState, ModelVersion
from oceanus.core.repository import load_hints, warmup
from oceanus.core.repository import loader as repository
from oceanus.core.scheduling.implicit_state import StateKeeper, state_specs
from oceanus.core.scheduling.instance import InstanceThread
from oceanus.core.scheduling.rate_limiter import RateLimiter

log = logging.getLogger("oceanus.core.models")

RunBlocking = Callable[..., Awaitable[Any]]
# How often a retiring version is checked for remaining requests.
_DRAIN_POLL_S = 0.005


# Triton's words for a model none of whose version folders the version policy selects.
NO_VERSIONS = "at least one version must be available under the version policy"
# Triton 2.51 refuses this at load (its qa/L0_response_cache greps for these words).
DECOUPLED_CACHE = (
    "Response Cache does not currently support model with decoupled transaction policy"
)


class ModelManager:
    def __init__(
        self,
        repositories: list[Path],
        models: dict[str, ModelEntry],
        run_blocking: RunBlocking,
        autocomplete: bool,
        gpu_count: int,
        backends: BackendRegistry,
        composer: ensemble.Composer | None = None,
        server: ServerHandle | None = None,
        response_cache: bool = False,
        refresh: Callable[[], None] | None = None,
        rate_limiter: RateLimiter | None = None,
        namespacing: bool = False,
        clock: Clock = MONOTONIC,
    ) -> None:
        self.repositories = repositories
        # What schedulers and statistics read the time from (tests drive it by hand).
        self._clock = clock
        self._refresh = refresh  # syncs mirrored repositories before each poll (blocking)
        # --model-namespacing: same-named models in several repositories (repository.scan)
        self.namespacing = namespacing
        self.backends = backends
        self.models = models
        self._run_blocking = run_blocking
        self._autocomplete = autocomplete
        self._gpu_count = gpu_count
        self._locks: dict[str, asyncio.Lock] = {}
        self._fingerprints: dict[str, tuple[Any, ...]] = {}
        self._override_dirs: dict[str, Path] = {}
        # What ensembles run their steps through, and what backends call back into (both the
        # server core).
        self._composer = composer
        self._server = server
        # Whether the server has a response cache (--cache-config): decoupled models that
        # enable it are then refused, as Triton refuses them.
        self._response_cache = response_cache
        # Server-wide resources instances hold while they execute (--rate-limit).
        self._rate_limiter = rate_limiter or RateLimiter()

    def scan(self) -> dict[str, Path]:
        """Model key -> folder in the repositories (blocking)."""
        return repository.scan(self.repositories, self.namespacing)

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
        check_model_name(name)
        async with self._lock(name):
            return await self._load_locked(name, config_json, files)

    async def load_at_start(self, name: str) -> None:
        """Load a model at start-up unless it was already tried (as an ensemble's dependency)."""
        async with self._lock(name):
            entry = self.models.get(name)
            if entry is not None and (entry.versions or entry.error):
                return
            await self._load_locked(name, None, None)

    async def ensure_loaded(self, name: str) -> ModelEntry:
        """An ensemble's composing model: loaded unless a version of it is ready already."""
        async with self._lock(name):
            entry = self.models.get(name)
            if entry is not None and entry.highest_ready() is not None:
                return entry
            return await self._load_locked(name, None, None)

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
            folders = await self._run_blocking(self.scan)
            folder = folders.get(name)
            if folder is None:
                raise invalid_arg(f"failed to load '{name}', failed to poll from model repository")
        entry = self.models.get(name)
        if entry is None:
            entry = self.models[name] = ModelEntry(name, folder)
        serving = {v: mv for v, mv in entry.versions.items() if mv.ready}
        try:
            config, backend, paths = await self._run_blocking(
                repository.prepare_config,
                folder,
                self._autocomplete,
                self._gpu_count,
                self.backends,
                override,
            )
            if not paths:
                raise invalid_arg(f"{NO_VERSIONS} of model '{name}'")
            if (
                self._response_cache
                and config.response_cache.enable
                and config.model_transaction_policy.decoupled
            ):
                raise invalid_arg(DECOUPLED_CACHE)
        except InferenceServerError as exc:
            hint = await self._run_blocking(_hint, folder, exc)  # it lists the folder
            log.error("failed to load '%s': %s%s", name, exc.message, hint)
            if not serving:
                entry.error = exc.message
            raise InferenceServerError(
                exc.code, f"failed to load '{name}': {exc.message}"
            ) from None
        if backend is None:
            keys = await self._run_blocking(self.scan) if self.namespacing else {}
            steps = {
                model: repository.key_near(model, folder, keys)
                for model, _ in ensemble.composing_models(config)
            }
            fresh = await self._load_ensemble(name, config, paths, steps)
        else:
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
        self, name: str, config: mc.ModelConfig, backend: Backend, paths: dict[int, Path]
    ) -> dict[int, ModelVersion]:
        loop = asyncio.get_running_loop()
        shown = repository.display_name(name)
        fresh = {v: ModelVersion(shown, v, config, path, self._clock) for v, path in paths.items()}
        results = await asyncio.gather(
            *(
                # Creates the instances, then runs the config's warmup samples on each.
                self._run_blocking(
                    warmup.load_version, config, backend, v, path, self._gpu_count, self._server
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
                prefix = f"failed to load '{name}' version {loaded.version}: "
                log.error(
                    "%s%s%s",
                    prefix,
                    version.reason.removeprefix(prefix),  # some reasons carry it already
                    _hint_text(loaded.error.hint),
                )
                continue
            workers = [
                InstanceThread(spec, instance, batched, loop, self._clock)
                for spec, instance in loaded.instances
            ]
            try:
                states = (
                    StateKeeper(state_specs(config, version.path.parent))
                    if config.sequence_batching.state
                    else None
                )
                gate = self._rate_limiter.gate(
                    name, config, workers, [spec.device_id for spec, _ in loaded.instances]
                )
            except InferenceServerError as exc:
                for worker in workers:
                    worker.instance.close()
                version.state = ModelState.UNAVAILABLE
                version.reason = exc.message
                log.error("failed to load '%s' version %d: %s", name, loaded.version, exc.message)
                continue
            if gate is not None and log.isEnabledFor(logging.DEBUG):
                log.debug("%s", self._rate_limiter.summary())
            version.start(workers, gate, states)
            log.info("successfully loaded '%s' version %d", name, loaded.version)
        return fresh

    async def _load_ensemble(
        self, name: str, config: mc.ModelConfig, paths: dict[int, Path], steps: dict[str, str]
    ) -> dict[int, ModelVersion]:
        """Load what the ensemble's steps need (as Triton does in every control mode), check
        the steps against those models, and make its versions (unavailable, with the reason,
        when a check fails)."""
        reason = await self._ensemble_problem(name, config, steps)
        fresh: dict[int, ModelVersion] = {}
        for version, path in paths.items():
            model = ensemble.EnsembleVersion(
                repository.display_name(name),
                version,
                config,
                path,
                self._composer_or_fail(),
                steps,
                self._clock,
            )
            if reason:
                model.state, model.reason = ModelState.UNAVAILABLE, reason
                log.error("failed to load '%s' version %d: %s", name, version, reason)
            else:
                model.start_ensemble()
                log.info("successfully loaded '%s' version %d", name, version)
            fresh[version] = model
        return fresh

    def _composer_or_fail(self) -> ensemble.Composer:
        if self._composer is None:
            raise RuntimeError("ensembles need the ModelManager's composer")
        return self._composer

    async def _ensemble_problem(
        self, name: str, config: mc.ModelConfig, steps: dict[str, str]
    ) -> str:
        """Why the ensemble cannot serve ("" when it can); `steps`: each composing model's
        key."""
        dependencies = ensemble.composing_models(config)
        cycle = await self._run_blocking(self._ensemble_cycle, name, config)
        if cycle:
            return "circular dependency between ensembles: " + " -> ".join(cycle)
        names = list(dict.fromkeys(model for model, _ in dependencies))
        results = await asyncio.gather(
            *(self.ensure_loaded(steps.get(model, model)) for model in names),
            return_exceptions=True,
        )
        configs: dict[str, mc.ModelConfig] = {}
        for model, result in zip(names, results, strict=True):
            if isinstance(result, InferenceServerError):
                return (
                    f"ensemble '{name}' depends on '{model}' which has no loaded version. "
                    f"Model '{model}' loading failed with error: {result.message}"
                )
            if isinstance(result, BaseException):
                raise result
            if result.config is None:
                return f"ensemble '{name}' depends on '{model}' which has no loaded version."
            configs[model] = result.config
        for model, version in dependencies:
            found = self.models[steps.get(model, model)].versions.get(version)
            if version >= 0 and (found is None or not found.ready):
                return (
                    f"ensemble '{name}' depends on '{model}' whose required version {version} "
                    "is not loaded"
                )
        try:
            ensemble.validate_steps(config, configs)
        except InferenceServerError as exc:
            return exc.message
        return ""

    def _ensemble_cycle(self, name: str, config: mc.ModelConfig) -> list[str] | None:
        """A chain of ensembles in the repositories leading back to itself (blocking)."""
        folders = self.scan()
        configs: dict[str, mc.ModelConfig | None] = {}
        pending = [m for m, _ in ensemble.composing_models(config)]
        while pending:
            model = pending.pop()
            if model in configs or model == name:
                continue
            configs[model] = None
            folder = folders.get(model)
            if folder is None:
                continue
            try:
                found = repository.read_config(folder, self._autocomplete, self.backends)
            except InferenceServerError:
                continue
            configs[model] = found
            if ensemble.is_ensemble(found):
                pending.extend(m for m, _ in ensemble.composing_models(found))
        return ensemble.find_cycle(name, config, configs)

    def _write_override(self, name: str, config: mc.ModelConfig, files: dict[str, bytes]) -> Path:
        """A private model folder made of the files a load request supplied (blocking)."""
        root = Path(tempfile.mkdtemp(prefix="oceanus-load-"))
        folder = root / name
        try:
            folder.mkdir()
            for relative, content in files.items():
                target = (folder / relative).resolve()
                if folder.resolve() not in target.parents:
                    raise invalid_arg(
                        f"failed to load '{name}': file path '{relative}' leaves the model"
                    )
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(content)
        except OSError as exc:  # a file name the file system refuses: the client's mistake
            shutil.rmtree(root, ignore_errors=True)
            raise invalid_arg(f"failed to load '{name}': {exc.strerror}") from None
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        previous = self._override_dirs.pop(name, None)
        self._override_dirs[name] = root
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)
        return folder

    # ---- unloading --------------------------------------------------------------------------

    async def unload(self, name: str) -> None:
        async with self._lock(name):
            entry = self.models.get(name)
            if entry is None:  # Triton 2.51 answers success: nothing to unload
                return
            await asyncio.gather(
                *(self._retire(mv, "unloaded") for mv in entry.versions.values() if mv.ready)
            )
            self._fingerprints.pop(name, None)

    async def _retire(self, version: ModelVersion, reason: str) -> None:
        """Stop routing to a version, let its queued and running requests finish, then free it."""
        version.state = ModelState.UNLOADING
        while version.pending_count:
            await asyncio.sleep(_DRAIN_POLL_S)
        await self._run_blocking(version.stop)
        version.reason = reason
        log.info("successfully unloaded '%s' version %d", version.name, version.version)

    async def unload_all(self) -> None:
        # Ensembles first: their running requests still send steps to the other models.
        ensembles = [
            name
            for name, entry in self.models.items()
            if entry.config is not None and ensemble.is_ensemble(entry.config)
        ]
        await asyncio.gather(*(self.unload(name) for name in ensembles))
        others = [name for name in self.models if name not in ensembles]
        await asyncio.gather(*(self.unload(name) for name in others))
        for root in self._override_dirs.values():
            shutil.rmtree(root, ignore_errors=True)

    # ---- polling ----------------------------------------------------------------------------

    async def poll_once(self) -> None:
        """Load new and changed models, unload removed ones (--model-control-mode=poll)."""
        if self._refresh is not None:
            await self._run_blocking(self._refresh)
        folders = await self._run_blocking(self.scan)
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


# The longest file name most file systems take (a model name is a folder name).
_NAME_MAX_BYTES = 255


def _hint(folder: Path, exc: InferenceServerError) -> str:
    """The log's advice for a model that failed before its versions loaded: a missing version
    folder explains most errors of a bare folder (even "unable to find backend ''"), so it
    comes first."""
    try:
        versions = repository.version_folders(folder)
    except OSError:
        return _hint_text(exc.hint)
    if versions and exc.message.startswith(NO_VERSIONS):
        return _hint_text(load_hints.version_policy_hint(folder, versions))
    return _hint_text(load_hints.version_folder_hint(folder, versions) or exc.hint)


def _hint_text(hint: str) -> str:
    return f" (hint: {hint})" if hint else ""


def check_model_name(name: str) -> None:
    """A model name names a folder of the repository: refuse what cannot (".", "..", slashes,
    NUL, longer than a file name may be) before it reaches the file system."""
    if (
        not name
        or name in (".", "..")
        or "/" in name
        or "\0" in name
        or len(name.encode("utf-8", "surrogatepass")) > _NAME_MAX_BYTES
    ):
        raise invalid_arg(
            f"failed to load '{name}': invalid model name (a model name is a folder name: not "
            f"'.' or '..', no '/', at most {_NAME_MAX_BYTES} bytes)"
        )


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
