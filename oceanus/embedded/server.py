"""`oceanus.Server`: an Oceanus server inside the calling Python process.

The core (repository, schedulers, instances, statistics) runs on its own event loop thread
(loop.py); this class is a face like the HTTP and gRPC frontends: it calls the core's public
methods on that loop and hands back plain Python values. No port is opened unless a frontend
is attached (oceanus.embedded.frontends, or `oceanus.tritonfrontend`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any, Protocol

from oceanus import startup
from oceanus.core.errors import InferenceServerError
from oceanus.core.server import ServerCore
from oceanus.embedded.errors import (
    InternalError,
    InvalidArgumentError,
    UnavailableError,
    UnsupportedError,
    translate,
)
from oceanus.embedded.loop import CoreLoop
from oceanus.embedded.model import Model
from oceanus.embedded.options import settings_from_command_line, settings_from_options
from oceanus.logs import configure
from oceanus.settings import Settings
from oceanus.storage import RepositoryError

log = logging.getLogger("oceanus.embedded")


class Attached(Protocol):
    """A frontend attached to a running server (stopped with it)."""

    def stop(self) -> None: ...


class ModelDictionary(dict[tuple[str, int], Model]):
    """`Server.models()`: (name, version) -> Model; a plain name gives the model's highest
    ready version (version -1), as in Triton."""

    def __init__(self, server: Server, models: list[Model]) -> None:
        super().__init__()
        for model in models:
            self[(model.name, model.version)] = model
        self._server = server
        self._names = {model.name for model in models}

    def __getitem__(self, key: Any) -> Model:
        if isinstance(key, tuple):
            try:
                return dict.__getitem__(self, key)
            except KeyError:
                raise KeyError(f"Unknown Model: {key}") from None
        if key in self._names:
            return Model(self._server, key)
        raise KeyError(f"Unknown Model: {key}")


class Server:
    """An in-process server. Options are the command line's flags as keywords
    (`Server(model_repository="models", model_control_mode="explicit")`), a `Settings`, or
    `Server.from_command_line([...])`."""

    def __init__(self, options: Settings | None = None, **kwargs: Any) -> None:
        if options is not None and kwargs:
            raise InvalidArgumentError("give a Settings object or keyword options, not both")
        self.settings: Settings = options if options is not None else settings_from_options(kwargs)
        self._core: ServerCore | None = None
        self._loop: CoreLoop | None = None
        self._attached: list[Attached] = []

    @classmethod
    def from_command_line(cls, argv: Sequence[str]) -> Server:
        """A server from `oceanus` command line flags (port flags only matter to the
        frontends attached later)."""
        return cls(settings_from_command_line(argv))

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(
        self,
        wait_until_ready: bool = False,
        polling_interval: float = 0.1,
        timeout: float | None = None,
    ) -> Server:
        """Start the core and load the models the control mode asks for (returns once they
        have loaded or failed); with `wait_until_ready`, also until the server is ready."""
        if self._core is not None:
            raise InvalidArgumentError("Server already started")
        from oceanus.main import log_model_table, open_repositories, span_exporter
        from oceanus.parts import core_options

        settings = self.settings
        configure(settings.log)
        problem = startup.check_repositories(settings)
        if problem is not None:
            raise InvalidArgumentError(problem)
        try:
            repositories = open_repositories(settings)
            exporter = span_exporter(settings)
        except (RepositoryError, RuntimeError) as exc:
            raise InvalidArgumentError(str(exc)) from None
        if settings.allow_metrics:
            from oceanus.frontends.metrics import parse_metrics_config
            from oceanus.frontends.metrics.server import enable_latency_recording

            enable_latency_recording(parse_metrics_config(settings.metrics_config))
        loop = CoreLoop()
        core = loop.call(ServerCore, core_options(settings, repositories, exporter))
        try:
            loop.run(core.start())
        except BaseException:
            loop.run(core.shutdown())
            loop.close()
            raise
        log_model_table(core)
        failures = core.load_failures()
        if failures and settings.exit_on_error:
            loop.run(core.shutdown())
            loop.close()
            reasons = "; ".join(f"{name}: {reason}" for name, reason in failures)
            raise InternalError(f"failed to load all models: {reasons}")
        self._core, self._loop = core, loop
        if wait_until_ready:
            self._wait_ready(polling_interval, timeout)
        return self

    def _wait_ready(self, polling_interval: float, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.ready():
            if deadline is not None and time.monotonic() >= deadline:
                raise UnavailableError("Timeout before ready")
            time.sleep(polling_interval)

    def stop(self) -> None:
        """Stop attached frontends, finish in-flight requests, unload every model, end the
        core's thread."""
        core, loop = self._core, self._loop
        if core is None or loop is None:
            return
        for frontend in reversed(self._attached):
            frontend.stop()
        self._attached.clear()
        try:
            loop.call(core.stop_accepting)
            loop.run(core.shutdown())
        finally:
            self._core = self._loop = None
            loop.close()

    def __enter__(self) -> Server:
        return self if self._core is not None else self.start(wait_until_ready=True)

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _require_started(self) -> ServerCore:
        if self._core is None:
            raise InvalidArgumentError("Server not started")
        return self._core

    def _loop_thread(self) -> CoreLoop:
        if self._loop is None:
            raise InvalidArgumentError("Server not started")
        return self._loop

    def _attach(self, frontend: Attached) -> None:
        self._attached.append(frontend)

    def _detach(self, frontend: Attached) -> None:
        if frontend in self._attached:
            self._attached.remove(frontend)

    def _call(self, function: Any, *args: Any) -> Any:
        try:
            return self._loop_thread().call(function, *args)
        except InferenceServerError as exc:
            raise translate(exc) from None

    def _run(self, coroutine: Any) -> Any:
        try:
            return self._loop_thread().run(coroutine)
        except InferenceServerError as exc:
            raise translate(exc) from None

    # ---- health and metadata ------------------------------------------------------------------

    def live(self) -> bool:
        core = self._require_started()
        return bool(self._call(lambda: core.live))

    def ready(self) -> bool:
        core = self._require_started()
        return bool(self._call(core.ready))

    def metadata(self) -> dict[str, Any]:
        core = self._require_started()
        return dict(self._call(core.metadata))

    def metrics(self, metric_format: Any = None) -> str:
        """The Prometheus text `/metrics` would serve (Triton's nv_* families)."""
        core = self._require_started()
        from oceanus.frontends.metrics import parse_metrics_config
        from oceanus.frontends.metrics.collector import TritonCollector
        from oceanus.frontends.metrics.exposition import render

        collector = TritonCollector(
            core,
            parse_metrics_config(self.settings.metrics_config),
            None,
            custom=core.custom_metrics,
        )
        return bytes(self._call(lambda: render(collector.collect()))).decode()

    # ---- models -------------------------------------------------------------------------------

    def model(self, model_name: str, model_version: int = -1) -> Model:
        return Model(self, model_name, model_version)

    def models(self, exclude_not_ready: bool = False) -> ModelDictionary:
        """Every model of the repositories, with each known version's state."""
        core = self._require_started()
        index = self._call(core.repository_index, exclude_not_ready)
        models = [
            Model(
                self,
                item["name"],
                int(item.get("version", -1)),
                item.get("state"),
                item.get("reason"),
            )
            for item in index
        ]
        return ModelDictionary(self, models)

    def load(
        self, model_name: str, parameters: dict[str, str | int | bool | bytes] | None = None
    ) -> Model:
        """Load (or reload) a model and wait until it is loaded (explicit control mode).
        `parameters`: `config` (JSON text) and `file:<version>/<name>` (bytes), as the
        repository extension takes them."""
        core = self._require_started()
        parameters = parameters or {}
        config = parameters.get("config")
        if config is not None and not isinstance(config, str):
            raise InvalidArgumentError("the 'config' parameter must be a string holding JSON")
        files: dict[str, bytes] = {}
        for key, value in parameters.items():
            if key.startswith("file:"):
                if not isinstance(value, (bytes, bytearray)):
                    raise InvalidArgumentError(f"parameter '{key}' must be bytes")
                files[key[len("file:") :]] = bytes(value)
        self._run(core.load_model(model_name, config, files or None))
        return self.model(model_name)

    def unload(
        self,
        model: str | Model,
        unload_dependents: bool = False,
        wait_until_unloaded: bool = False,
        polling_interval: float = 0.1,
        timeout: float | None = None,
    ) -> None:
        """Unload a model (explicit control mode); returns once it is unloaded."""
        core = self._require_started()
        name = model.name if isinstance(model, Model) else model
        self._run(core.unload_model(name))

    def poll_model_repository(self) -> None:
        """Apply the repositories' changes now (poll control mode)."""
        core = self._require_started()
        if core.options.control_mode != "poll":
            raise UnavailableError("poll is only allowed in poll mode")
        self._run(_poll(core))

    def register_model_repository(self, repository_path: str, name_mapping: Any = None) -> None:
        raise UnsupportedError("registering model repositories at run time is not supported")

    def unregister_model_repository(self, repository_path: str) -> None:
        raise UnsupportedError("unregistering model repositories at run time is not supported")


async def _poll(core: ServerCore) -> None:
    await asyncio.sleep(0)
    await core.manager.poll_once()
