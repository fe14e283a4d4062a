"""The protocol-agnostic server core: the models it serves and the calls every frontend makes.

Frontends translate their wire format into these calls and back; nothing here knows HTTP or gRPC.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from oceanus import __version__
from oceanus.core import classification
from oceanus.core.backend_registry import BackendRegistry
from oceanus.core.clock import MONOTONIC, Clock
from oceanus.core.errors import (
    InferenceServerError,
    invalid_arg,
    not_found,
    unavailable,
    unsupported,
)
from oceanus.core.generation import GenerationInfo
from oceanus.core.model import ModelEntry, ModelState, ModelVersion
from oceanus.core.observability.custom_metrics import CustomMetricRegistry
from oceanus.core.observability.tracing import SpanExporter, TraceConfig, TraceManager
from oceanus.core.repository import loader as repository
from oceanus.core.repository.manager import ModelManager
from oceanus.core.response_cache import ResponseCache, cacheable
from oceanus.core.scheduling.instance import ThreadBatches
from oceanus.core.scheduling.rate_limiter import RateLimiter, ResourceLimit
from oceanus.core.shared_memory import SharedMemoryManager
from oceanus.core.types import InferRequest, InferResponse, is_number

log = logging.getLogger("oceanus.core")

SERVER_NAME = "oceanus"
# Triton's refusal of a decoupled model on a one-response call; `caller` names the call.
DECOUPLED_UNSUPPORTED = "{caller} doesn't support models with decoupled transaction policy"


# A model key as clients see it (without the namespace of --model-namespacing): part of the
# core's face, so that frontends need not reach into the repository code.
display_name = repository.display_name


def batches_on_threads() -> int:
    """How many batches execute on instance threads right now, in this process: busy polling
    (frontends/http/busy_poll.py) stays off meanwhile, so as not to take a computing model's
    CPU."""
    return ThreadBatches.executing


@dataclass
class CoreOptions:
    repositories: list[Path]
    # The backends models may use (the server assembly registers them; the core imports none).
    backends: BackendRegistry = field(default_factory=BackendRegistry)
    autocomplete: bool = True
    strict_readiness: bool = True
    load_threads: int = 4
    control_mode: str = "none"  # none | poll | explicit
    startup_models: list[str] = field(default_factory=list)  # explicit mode; "*" = all
    poll_seconds: float = 15.0
    # Extensions the running frontends really implement, listed by server metadata.
    extensions: list[str] = field(default_factory=list)
    trace: TraceConfig = field(default_factory=TraceConfig)
    # Where traces go in trace mode "opentelemetry" (oceanus/core/observability/tracing_otel.py).
    span_exporter: SpanExporter | None = None
    # The `local` response cache's size in bytes (--cache-config local,size=N); 0: no cache.
    response_cache_size: int = 0
    # Brings the repository folders up to date before a poll or an explicit load (blocking):
    # how folders that mirror object storage follow it (oceanus/storage). None: nothing to do.
    refresh_repositories: Callable[[], None] | None = None
    # --rate-limit (execution_count | off) and --rate-limit-resource
    # (core/scheduling/rate_limiter.py).
    rate_limit: str = "off"
    rate_limit_resources: list[ResourceLimit] = field(default_factory=list)
    # --model-namespacing: a model name may appear in several repositories.
    model_namespacing: bool = False
    # What schedulers and statistics read the time from; tests hand in a clock they drive.
    clock: Clock = MONOTONIC


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
        self._executor = ThreadPoolExecutor(
            max_workers=max(1, options.load_threads), thread_name_prefix="oceanus-load"
        )
        self.manager = ModelManager(
            options.repositories,
            self.models,
            self._run_blocking,
            options.autocomplete,
            _gpu_count(),
            options.backends,
            composer=self,
            server=self,
            response_cache=options.response_cache_size > 0,
            refresh=options.refresh_repositories,
            rate_limiter=RateLimiter(options.rate_limit, options.rate_limit_resources),
            namespacing=options.model_namespacing,
            clock=options.clock,
        )
        self.tracer = TraceManager(options.trace, options.span_exporter)
        # Metric families the models create (Python models' pb_utils.MetricFamily), for /metrics.
        self.custom_metrics = CustomMetricRegistry()
        # Regions clients registered with the system shared memory extension.
        self.shared_memory = SharedMemoryManager()
        # Triton's response cache, used by models whose config enables it (None: not configured).
        self.response_cache = (
            ResponseCache(options.response_cache_size) if options.response_cache_size > 0 else None
        )
        self._cache_warned: weakref.WeakSet[ModelVersion] = weakref.WeakSet()
        if self.response_cache is not None:
            log.info("response cache: local, %d bytes", options.response_cache_size)
        self.live = False
        self._shutting_down = False
        self._poller: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop the core runs on (backends call back into it from their threads)."""
        if self._loop is None:
            raise RuntimeError("the server core has not started")
        return self._loop

    # ---- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the models the control mode asks for (several at a time, off the loop)."""
        options = self.options
        self._loop = asyncio.get_running_loop()
        folders = await self._run_blocking(self.manager.scan)
        if options.control_mode == "explicit":
            wanted = list(folders) if "*" in options.startup_models else options.startup_models
        else:
            wanted = list(folders)
        self.live = True
        await asyncio.gather(*(self._load_at_start(name) for name in wanted))
        self._warn_uncached()
        if options.control_mode == "poll":
            self._poller = asyncio.create_task(self.manager.poll_forever(options.poll_seconds))

    async def _load_at_start(self, name: str) -> None:
        try:
            await self.manager.load_at_start(name)
        except InferenceServerError as exc:
            if name not in self.models:  # not even a folder: remember why for the index
                log.error("%s", exc.message)  # (the manager logs every other failure)
                self.models[name] = ModelEntry(name, Path(), error=exc.message)

    async def load_model(
        self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None
    ) -> None:
        """The repository extension's load: only in explicit mode, as in Triton."""
        self._require_explicit()
        if self.options.refresh_repositories is not None and not files:
            await self._run_blocking(self.options.refresh_repositories)
        try:
            await self.manager.load(name, config_json, files)
        finally:
            self._warn_uncached()

    async def unload_model(self, name: str) -> None:
        self._require_explicit()
        await self.manager.unload(name)

    def _require_explicit(self) -> None:
        if self.options.control_mode != "explicit":
            raise unavailable("explicit model load / unload is not allowed if polling is enabled")

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

    def stop_accepting(self) -> None:
        """Shutdown begins: health turns not-ready and new inference requests are refused."""
        self._shutting_down = True

    async def shutdown(self) -> None:
        """Let queued and running requests finish, then unload everything."""
        self._shutting_down = True
        if self._poller is not None:
            self._poller.cancel()
        await self.manager.unload_all()
        self.shared_memory.close()
        self._executor.shutdown(wait=False)
        self.tracer.close()

    # ---- health and metadata ----------------------------------------------------------------

    def ready(self) -> bool:
        if not self.live or self._shutting_down:
            return False
        if not self.options.strict_readiness:
            return True
        return all(
            not entry.error and all(v.healthy() for v in entry.versions.values())
            for entry in self.models.values()
        )

    def metadata(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": __version__, "extensions": self.options.extensions}

    def resolve(self, name: str, version: str = "") -> ModelVersion:
        """The model version a request names (the highest ready one when none is named)."""
        entry = self.models.get(name)
        if entry is None and self.options.model_namespacing:
            _check_unambiguous(name, self.models)
        if entry is None or (entry.error and not entry.versions):
            raise not_found(f"Request for unknown model: '{name}' is not found")
        if not version:
            found = entry.highest_ready()
            if found is None:
                raise not_found(f"Request for unknown model: '{name}' has no available versions")
            return found
        try:
            if not version.isascii():  # int() reads Arabic-Indic digits as numbers
                raise ValueError(version)
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
        """The model ready endpoints' answer (and `pb_utils.is_model_ready`): loaded, healthy,
        and the model's own readiness check (a Python model's `is_ready()`) passes."""
        try:
            return self.resolve(name, version).ready_check()
        except InferenceServerError:
            return False

    def model_serving(self, name: str, version: str = "") -> bool:
        """Loaded and able to execute (without the model's own readiness check)."""
        try:
            return self.resolve(name, version).healthy()
        except InferenceServerError:
            return False

    def queued_count(self, name: str, version: str) -> int:
        """Requests for this version in the server's queue, not yet handed to an instance. Read
        from the engine threads of language models: a plain read that never raises."""
        try:
            scheduler = self.resolve(name, version).scheduler
            return int(getattr(scheduler, "queued_count", 0))
        except Exception:  # unknown, unloading, or the models changing under a foreign thread
            return 0

    def is_decoupled(self, name: str, version: str = "") -> bool:
        """Whether the model answers through infer_stream() (raises if it is unknown)."""
        return self.resolve(name, version).decoupled

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        model_version = self.resolve(name, version)
        entry = self.models[name]
        versions = [str(v) for v in sorted(entry.versions) if entry.versions[v].ready]
        return model_version.metadata(versions)

    def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        return self.resolve(name, version).config

    def generation_info(self, name: str, version: str = "") -> GenerationInfo | None:
        """Whether the model's engine takes typed requests (token ids, SamplingParams), with
        its context length and tokenizer; None: it speaks the vLLM backend's tensors only."""
        return self.resolve(name, version).generation_info()

    # ---- inference --------------------------------------------------------------------------

    def infer(self, request: InferRequest, caller: str) -> asyncio.Future[InferResponse]:
        """Validate and queue a request (on the loop); await the returned future.

        A decoupled model is refused (UNSUPPORTED) with Triton's text naming `caller`, the
        frontend's call ("HTTP end point", "ModelInfer RPC")."""
        if self._shutting_down:
            raise unavailable("Server is shutting down")
        model = self.resolve(request.model_name, request.model_version)
        if model.decoupled:
            raise unsupported(DECOUPLED_UNSUPPORTED.format(caller=caller))
        return self._infer_one(model, request)

    def infer_stream(
        self,
        request: InferRequest,
        empty_final: bool | None = None,
        mark_final: bool | None = None,
    ) -> AsyncIterator[InferResponse]:
        """Validate and queue a request (on the loop); iterate its responses.

        For decoupled models (0..N responses per request); any other model yields its one
        response. Validation errors raise here, an error response raises from the iteration,
        and leaving the iteration early cancels the request (see ModelVersion.infer_stream).
        `empty_final`: yield a final flag sent alone as an empty response (default: as the
        request's `triton_enable_empty_final_response` parameter says); `mark_final`: set the
        `triton_final_response` parameter on each response (default: the same)."""
        if self._shutting_down:
            raise unavailable("Server is shutting down")
        model = self.resolve(request.model_name, request.model_version)
        if model.decoupled:
            responses = model.infer_stream(request, empty_final, mark_final)
            if request.shm_regions:
                return _holding(request.shm_regions, responses)
            return responses
        return _one(self._infer_one(model, request))

    def _infer_one(
        self, model: ModelVersion, request: InferRequest
    ) -> asyncio.Future[InferResponse]:
        """A one-response request, through the response cache when its model uses it; the
        shared memory regions it names stay in use until it completes."""
        cache = self.response_cache
        if cache is not None and self.cache_enabled(model) and cacheable(request):
            future = cache.infer(model, request)
        else:
            future = model.infer(request)
        counts = classification.class_counts(request)
        if counts is not None:  # Triton's classification extension, after the model answered
            batched = model.config.max_batch_size > 0
            future = classification.chain(future, counts, batched, model.labels())
        if request.shm_regions:
            self.shared_memory.hold(request.shm_regions, future)
        return future

    def cache_enabled(self, model: ModelVersion) -> bool:
        """Whether `model` uses the response cache: the server has one and the model's config
        enables it (decoupled and sequence batching models never do, as in Triton)."""
        return (
            self.response_cache is not None
            and model.config.response_cache.enable
            and not model.decoupled
            and not model.config.HasField("sequence_batching")
        )

    def _warn_uncached(self) -> None:
        """Once per loaded version: a model enabling the response cache while the server has
        none (or cannot cache it) runs without one."""
        for entry in self.models.values():
            for version in entry.versions.values():
                if not version.config.response_cache.enable or version in self._cache_warned:
                    continue
                self._cache_warned.add(version)
                if self.response_cache is None:
                    log.warning(
                        "model '%s' version %d enables the response cache, but the server's "
                        "response cache is not configured (--cache-config local,size=<bytes>); "
                        "running without it",
                        version.name,
                        version.version,
                    )
                elif not self.cache_enabled(version):
                    kind = "decoupled" if version.decoupled else "sequence batching"
                    log.warning(
                        "model '%s' version %d: the response cache does not support %s models; "
                        "running without it",
                        version.name,
                        version.version,
                        kind,
                    )

    # ---- statistics and repository ------------------------------------------------------------

    def ready_versions(self) -> list[ModelVersion]:
        """Every ready version, by model key and version number: what /metrics exports, so
        that frontends need not walk `models` themselves."""
        return [
            version
            for key in sorted(self.models)
            for _, version in sorted(self.models[key].versions.items())
            if version.ready
        ]

    def statistics(self, name: str = "", version: str = "") -> list[dict[str, Any]]:
        if name:
            entry = self.models.get(name)
            if entry is None or entry.highest_ready() is None:
                raise invalid_arg(f"requested model '{name}' is not available")
            if version:
                found = entry.versions.get(int(version)) if is_number(version) else None
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
        """Triton's index: every model folder, with each known version's state (and reason)."""
        index: list[dict[str, Any]] = []
        try:
            names = set(self.manager.scan())  # a few listdir calls
        except InferenceServerError:
            names = set()
        for key in sorted(names | set(self.models)):
            entry = self.models.get(key)
            name = repository.display_name(key)
            if entry is None or (not entry.versions and not entry.error):
                if not ready_only:
                    index.append({"name": name})
                continue
            if entry.error and not entry.versions:
                if not ready_only:
                    index.append({"name": name, "state": "UNAVAILABLE", "reason": entry.error})
                continue
            for number, version in sorted(entry.versions.items()):
                if ready_only and not version.ready:
                    continue
                item = {"name": name, "version": str(number), "state": version.state.value}
                if version.reason:
                    item["reason"] = version.reason
                index.append(item)
        return index


def _holding(
    regions: list[Any], responses: AsyncIterator[InferResponse]
) -> AsyncIterator[InferResponse]:
    """A decoupled request's responses, its shared memory regions in use from now until the
    iteration ends."""
    for region in regions:
        region.users += 1

    async def released() -> AsyncIterator[InferResponse]:
        try:
            async for response in responses:
                yield response
        finally:
            for region in regions:
                region.users -= 1

    return released()


async def _one(future: asyncio.Future[InferResponse]) -> AsyncIterator[InferResponse]:
    try:
        yield await future
    finally:
        if not future.done():
            future.cancel()


def _check_unambiguous(name: str, models: dict[str, ModelEntry]) -> None:
    """A plain name that several namespaces hold (Triton's text: the API cannot name one)."""
    count = sum(
        1
        for key in models
        if repository.NAMESPACE_SEPARATOR in key and repository.display_name(key) == name
    )
    if count > 1:
        raise invalid_arg(
            f"There are {count} identifiers of model '{name}' in global map, model namespace "
            "must be provided to resolve ambiguity."
        )
