"""HTTP, gRPC and metrics services attached to a running in-process server, as NVIDIA's
`tritonfrontend` attaches them to a `tritonserver.Server`: `KServeHttp(server, options)`,
`start()` / `stop()` or a `with` block. They are the server process's own frontends, run on
the core's loop; options left unset take the server's flags (`http_port=...` given to
`Server`, or the command line's defaults).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from oceanus.embedded.errors import InvalidArgumentError, UnavailableError
from oceanus.embedded.server import Server
from oceanus.frontends.grpc.server import GrpcFrontend
from oceanus.frontends.grpc.service import GrpcService
from oceanus.frontends.http.protocol import HttpServer
from oceanus.frontends.metrics import MetricsFrontend
from oceanus.parts import grpc_options, http_frontend, http_server, metrics_options


class _Service:
    """Start/stop on the server's loop, context manager, detach on stop."""

    def __init__(self, server: Server) -> None:
        server._require_started()
        self._server = server
        self._started = False

    def start(self) -> None:
        if self._started:
            raise InvalidArgumentError(f"{type(self).__name__} already started")
        try:
            self._server._loop_thread().run(self._start())
        except OSError as exc:
            raise UnavailableError(str(exc)) from None
        self._started = True
        self._server._attach(self)

    def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        self._server._detach(self)
        self._server._loop_thread().run(self._stop())

    async def _start(self) -> None:
        raise NotImplementedError

    async def _stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class KServeHttp(_Service):
    """The KServe v2 HTTP/REST service (Triton's extensions included)."""

    @dataclass
    class Options:
        address: str | None = None
        port: int | None = None
        reuse_port: bool = False
        # Accepted for Triton's API; one event loop serves every connection.
        thread_count: int = 8
        header_forward_pattern: str | None = None
        restricted_apis: dict[str, tuple[str, str]] | None = None

    def __init__(self, server: Server, options: KServeHttp.Options | None = None) -> None:
        super().__init__(server)
        settings = server.settings
        options = options or KServeHttp.Options()
        self.options = dataclasses.replace(
            options,
            address=options.address if options.address is not None else settings.http_address,
            port=options.port if options.port is not None else settings.http_port,
            header_forward_pattern=(
                options.header_forward_pattern
                if options.header_forward_pattern is not None
                else settings.http_header_forward_pattern
            ),
        )
        self._http: HttpServer | None = None

    async def _start(self) -> None:
        settings = self._server.settings
        options = self.options
        frontend = http_frontend(
            settings,
            self._server._require_started(),
            restricted=options.restricted_apis or None,
            header_forward_pattern=options.header_forward_pattern or "",
        )
        http = http_server(settings, frontend.handle)
        await http.start(options.address or "0.0.0.0", options.port or 0, options.reuse_port)
        self._http = http

    async def _stop(self) -> None:
        if self._http is not None:
            await self._http.stop(self._server.settings.exit_timeout_secs)
            self._http = None


class KServeGrpc(_Service):
    """The KServe v2 gRPC service (GRPCInferenceService, streaming included)."""

    @dataclass
    class Options:
        address: str | None = None
        port: int | None = None
        reuse_port: bool = False
        header_forward_pattern: str | None = None

    def __init__(self, server: Server, options: KServeGrpc.Options | None = None) -> None:
        super().__init__(server)
        options = options or KServeGrpc.Options()
        settings = server.settings
        self.options = options
        self._grpc_options = grpc_options(
            settings, options.reuse_port, options.address, options.port
        )
        self._header_forward = (
            options.header_forward_pattern
            if options.header_forward_pattern is not None
            else settings.grpc_header_forward_pattern
        )
        self._grpc: GrpcFrontend | None = None

    async def _start(self) -> None:
        settings = self._server.settings
        service = GrpcService(
            self._server._require_started(),
            self._grpc_options.restricted,
            settings.log,
            self._header_forward,
        )
        grpc = GrpcFrontend(service, self._grpc_options)
        await grpc.start()
        self._grpc = grpc

    async def _stop(self) -> None:
        if self._grpc is not None:
            await self._grpc.stop(self._server.settings.exit_timeout_secs)
            self._grpc = None


class Metrics(_Service):
    """Prometheus `/metrics` with Triton's nv_* families (and the live status page)."""

    @dataclass
    class Options:
        address: str | None = None
        port: int | None = None
        # Accepted for Triton's API.
        thread_count: int = 1

    def __init__(self, server: Server, options: Metrics.Options | None = None) -> None:
        super().__init__(server)
        options = options or Metrics.Options()
        settings = server.settings
        self.options = dataclasses.replace(
            options,
            address=options.address if options.address is not None else settings.metrics_address,
            port=options.port if options.port is not None else settings.metrics_port,
        )
        self._metrics: MetricsFrontend | None = None

    async def _start(self) -> None:
        settings = self._server.settings
        metrics = MetricsFrontend(
            self._server._require_started(),
            metrics_options(settings, self.options.address or "0.0.0.0", self.options.port or 0),
        )
        await metrics.start()
        self._metrics = metrics

    async def _stop(self) -> None:
        if self._metrics is not None:
            await self._metrics.stop()
            self._metrics = None


# NVIDIA's first tritonfrontend release spelled construction `KServeHttp.Server(server, ...)`.
KServeHttp.Server = KServeHttp  # type: ignore[attr-defined]
KServeGrpc.Server = KServeGrpc  # type: ignore[attr-defined]
Metrics.Server = Metrics  # type: ignore[attr-defined]
