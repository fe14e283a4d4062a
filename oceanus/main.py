"""The server process: starts the core and the frontends on one event loop, stops them cleanly."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import pickle
import signal
from collections.abc import Callable
from typing import Any

from oceanus import startup
from oceanus.core.model import ModelState
from oceanus.core.observability.tracing import MODE_OPENTELEMETRY, SpanExporter
from oceanus.core.server import ServerCore
from oceanus.frontends.grpc.server import GrpcFrontend
from oceanus.frontends.grpc.service import GrpcService
from oceanus.frontends.http.protocol import Handler, HttpServer
from oceanus.frontends.metrics import MetricsFrontend, parse_metrics_config
from oceanus.frontends.metrics.server import enable_latency_recording
from oceanus.frontends.openai import OpenAIFrontend
from oceanus.frontends.workers import mirror
from oceanus.frontends.workers.core_link import CoreLink
from oceanus.frontends.workers.supervisor import FrontendWorkers, auto_workers, claim_port
from oceanus.ipc import budget
from oceanus.logs import configure, table
from oceanus.parts import core_options, grpc_options, http_frontend, http_server, metrics_options
from oceanus.settings import Settings
from oceanus.storage import RepositoryError, RepositorySet

log = logging.getLogger("oceanus.server")

# The start-up model table's widest line (a terminal's width).
TABLE_WIDTH = 100


def open_repositories(settings: Settings) -> RepositorySet:
    """Local folders for the repositories; remote ones (s3://, gs://, as://) mirrored first."""
    if settings.model_repositories:
        return RepositorySet.open(settings.model_repositories)
    from oceanus.examples import example_repository

    log.info("no --model-repository given: serving the built-in example repository")
    return RepositorySet([example_repository()], [])


def span_exporter(settings: Settings) -> SpanExporter | None:
    """The OpenTelemetry exporter when --trace-config mode=opentelemetry asks for one."""
    if settings.trace.mode != MODE_OPENTELEMETRY:
        return None
    from oceanus.core.observability.tracing_otel import OtlpSpanExporter

    return OtlpSpanExporter(settings.trace.mode_options)


class Server:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.core: ServerCore | None = None
        self._stop = asyncio.Event()
        self._http: HttpServer | None = None
        self._grpc: GrpcFrontend | None = None
        self._metrics: MetricsFrontend | None = None
        self._workers: FrontendWorkers | None = None
        self._openai: OpenAIFrontend | None = None
        self._openai_server: HttpServer | None = None

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self) -> int:
        settings = self.settings
        # Before any model loads (or the examples are generated): a missing folder or a taken
        # port is one line naming its flag, at once.
        problem = startup.check_repositories(settings) or startup.check_ports(settings)
        if problem is not None:
            log.error("%s", problem)
            return 1
        try:
            repositories = await asyncio.get_running_loop().run_in_executor(
                None, open_repositories, settings
            )
        except RepositoryError as exc:
            log.error("%s", exc)
            return 1
        try:
            exporter = span_exporter(settings)
        except RuntimeError as exc:  # the optional OpenTelemetry SDK is missing
            log.error("%s", exc)
            return 1
        self.core = core = ServerCore(core_options(settings, repositories, exporter))
        if settings.allow_metrics:
            # Before models load: their statistics then keep any summaries/histograms asked for.
            enable_latency_recording(parse_metrics_config(settings.metrics_config))
        await core.start()
        log_model_table(core)
        failures = core.load_failures()
        if failures and settings.exit_on_error:
            # Each failure was logged once, in full, as it happened (and is in the table).
            log.error("exiting: failed to load all models (--exit-on-error=true)")
            await core.shutdown()
            return 1
        try:
            # HTTP last: once /v2/health/live answers, every other endpoint is up too.
            if settings.allow_metrics:
                await self._start_metrics(core)
            self._openai = self.openai_frontend(core)
            if settings.openai_port is not None:
                await self._start_openai(self._openai)
            workers = frontend_worker_count(settings)
            if workers > 0 and (settings.allow_http or settings.allow_grpc):
                await self._start_workers(core, workers)
            else:
                if settings.allow_grpc:
                    await self._start_grpc(core)
                if settings.allow_http:
                    await self._start_http(core)
            await self._stop.wait()
            log.info("stopping: waiting for in-flight requests")
            core.stop_accepting()
        finally:
            # The frontends (in-process or in the workers) drain at once, within one
            # --exit-timeout-secs; metrics stay up until they are done, so the drain can be
            # watched.
            drained = await asyncio.gather(
                self._stop_http(), self._stop_grpc(), self._stop_workers(), self._stop_openai()
            )
            await self._stop_metrics()
            await core.shutdown()
        if not all(drained):
            log.error("Exit timeout expired. Exiting immediately.")  # Triton's words, and exit 1
            return 1
        return 0

    def openai_frontend(self, core: ServerCore) -> OpenAIFrontend:
        """The OpenAI routes (`oceanus serve` names the model as vLLM's clients ask for it)."""
        settings = self.settings
        return OpenAIFrontend(
            core,
            settings.chat_template,
            settings.http_restricted_apis,
            settings.http_max_input_size,
        )

    def http_handler(self, core: ServerCore, routes: Handler) -> Handler:
        """What the HTTP port answers (`oceanus serve` adds /health, /metrics, --api-key)."""
        return routes

    def _openai_routes(self) -> Any:
        return self._openai.handle if self._openai is not None else None

    async def _start_openai(self, frontend: OpenAIFrontend) -> None:
        """`--openai-port`: the OpenAI routes alone on their own port (in this process)."""
        settings = self.settings
        assert settings.openai_port is not None
        self._openai_server = http_server(settings, frontend.handle_own_port, busy_poll=False)
        await _listen(
            self._openai_server, settings.http_address, settings.openai_port, "the OpenAI service"
        )
        log.info("Started OpenAI service at %s:%d", settings.http_address, settings.openai_port)

    async def _stop_openai(self) -> bool:
        if self._openai_server is None:
            return True
        return await self._openai_server.stop(self.settings.exit_timeout_secs)

    async def _start_http(self, core: ServerCore) -> None:
        settings = self.settings
        frontend = http_frontend(settings, core, self._openai_routes())
        self._http = http_server(settings, self.http_handler(core, frontend.handle))
        await _listen(self._http, settings.http_address, settings.http_port, "HTTP service")
        log.info("Started HTTPService at %s:%d", settings.http_address, settings.http_port)

    async def _stop_http(self) -> bool:
        """Drain HTTP; whether every request received was answered in time."""
        if self._http is None:
            return True
        return await self._http.stop(self.settings.exit_timeout_secs)

    async def _start_grpc(self, core: ServerCore) -> None:
        settings = self.settings
        options = grpc_options(settings)
        service = GrpcService(
            core, options.restricted, settings.log, settings.grpc_header_forward_pattern
        )
        self._grpc = GrpcFrontend(service, options)
        try:
            await self._grpc.start()
        except OSError as exc:
            self._grpc = None
            raise SystemExit(str(exc)) from None
        log.info("Started GRPCInferenceService at %s", options.endpoint)

    async def _start_workers(self, core: ServerCore, count: int) -> None:
        """HTTP and gRPC in `count` worker processes; this process keeps the core (issue 16,
        docs/architecture.md "Frontend worker processes")."""
        settings = self.settings = self._claim_ports(self.settings)
        http = http_frontend(settings, core, self._openai_routes())
        service = GrpcService(
            core,
            settings.grpc_restricted_protocols,
            settings.log,
            settings.grpc_header_forward_pattern,
        )
        handlers = {**service.method_handlers(), **service.health_handlers()}

        specs = mirror.Specs(core)

        def state() -> dict[str, Any]:
            return {
                "tracing": core.tracer.active,
                "log": dataclasses.asdict(settings.log),
                "models": specs(),  # what the workers validate requests against
                "generating": specs.generating(),  # the models whose chats workers tokenize
            }

        self._workers = FrontendWorkers(
            count, pickle.dumps(settings), lambda: CoreLink(core, http, handlers), state
        )
        # Live (and ready) only once every worker listens, as in-process HTTP starts last: a
        # worker that is up early answers its health probes "not yet" meanwhile.
        core.live = False
        try:
            await self._workers.start()
        except OSError as exc:
            raise SystemExit(str(exc)) from None
        core.live = True
        if settings.allow_grpc:
            log.info("Started GRPCInferenceService at %s", grpc_options(settings).endpoint)
        if settings.allow_http:
            log.info("Started HTTPService at %s:%d", settings.http_address, settings.http_port)
        log.info("%d frontend worker processes serve HTTP and gRPC", count)

    @staticmethod
    def _claim_ports(settings: Settings) -> Settings:
        """The settings with the HTTP and gRPC ports checked free (and port 0 resolved), so that
        every worker binds the same port and a port in use fails the start, as in-process."""
        http_port, grpc_port = settings.http_port, settings.grpc_port
        if settings.allow_http:
            try:
                http_port = claim_port(settings.http_address, http_port)
            except OSError as exc:
                raise SystemExit(
                    f"failed to start HTTP service on {settings.http_address}:{http_port}: "
                    f"{exc.strerror}"
                ) from None
        if settings.allow_grpc:
            endpoint = grpc_options(settings).endpoint
            try:
                grpc_port = claim_port(settings.grpc_address, grpc_port)
            except OSError as exc:
                raise SystemExit(
                    f"failed to start GRPC service on {endpoint}: {exc.strerror}"
                ) from None
        # A copy, not dataclasses.replace: that would derive a new `log` (and `trace`), and the
        # logging endpoints must change the one object every frontend holds.
        claimed = copy.copy(settings)
        claimed.http_port, claimed.grpc_port = http_port, grpc_port
        return claimed

    async def _stop_grpc(self) -> bool:
        if self._grpc is None:
            return True
        await self._grpc.stop(self.settings.exit_timeout_secs)
        self._grpc = None
        return True

    async def _stop_workers(self) -> bool:
        """Drain the worker processes; whether each finished its requests in time."""
        if self._workers is None:
            return True
        return await self._workers.stop(self.settings.exit_timeout_secs)

    async def _start_metrics(self, core: ServerCore) -> None:
        settings = self.settings
        self._metrics = MetricsFrontend(
            core,
            metrics_options(settings, ports=self._served_ports),
        )
        try:
            await self._metrics.start()
        except OSError as exc:
            self._metrics = None
            raise SystemExit(str(exc)) from None
        log.info("Started Metrics Service at %s", self._metrics.endpoint)

    def _served_ports(self) -> dict[int, str]:
        """The ports whose connections the status page counts (read when it polls: the worker
        start may have resolved them since)."""
        settings = self.settings
        ports = {}
        if settings.allow_grpc:
            ports[settings.grpc_port] = "grpc"
        if settings.allow_http:
            ports[settings.http_port] = "http"
        return ports

    async def _stop_metrics(self) -> None:
        if self._metrics is None:
            return
        await self._metrics.stop()
        self._metrics = None


async def _listen(server: HttpServer, address: str, port: int, service: str) -> None:
    """Start an HTTP server; a port that cannot be had ends the process with one line."""
    try:
        await server.start(address, port)
    except OSError as exc:
        raise SystemExit(f"failed to start {service} on {address}:{port}: {exc.strerror}") from None


def log_model_table(core: ServerCore) -> None:
    """The start-up table of models, versions and states (as Triton prints it)."""
    rows: list[list[str]] = []
    for entry in sorted(core.models.values(), key=lambda e: e.name):
        if entry.error and not entry.versions:
            rows.append([entry.name, "-", f"UNAVAILABLE: {entry.error}"])
        for number, version in sorted(entry.versions.items()):
            status = version.state.value
            if version.state is ModelState.UNAVAILABLE:
                status = f"UNAVAILABLE: {version.reason}"
            rows.append([entry.name, str(number), status])
    # As Triton prints it, but within a terminal's width: a long reason is cut here and
    # is whole in its "failed to load" line above.
    log.info("\n%s", table(["Model", "Version", "Status"], rows, max_width=TABLE_WIDTH))
    # A container's /dev/shm is often small (Docker: 64 MB): say what there is and what the
    # models' rings took, so a too-small one is seen before it matters.
    size, free = budget.usage()
    log.info(
        "%s: %s, %s used, %s reserved by the loaded models' rings",
        budget.shm_dir(),
        budget.human(size),
        budget.human(size - free),
        budget.human(budget.reserved()),
    )


def frontend_worker_count(settings: Settings) -> int:
    """`--frontend-workers`: the number asked for, or `auto`'s (supervisor.auto_workers)."""
    if settings.frontend_workers is not None:
        return settings.frontend_workers
    return auto_workers()


def install_uvloop() -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        pass


def run(
    settings: Settings,
    ignored_flags: list[str] | None = None,
    make_server: Callable[[Settings], Server] = Server,
) -> int:
    """Run the server until SIGINT/SIGTERM; returns the process exit code."""
    configure(settings.log)
    for flag in ignored_flags or []:
        log.warning("flag %s is accepted for compatibility but not implemented; ignoring it", flag)
    install_uvloop()

    async def main() -> int:
        server = make_server(settings)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, server.request_stop)
        return await server.run()

    return asyncio.run(main())
