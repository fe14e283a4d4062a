"""The metrics endpoint: a tiny ASGI app on its own uvicorn server, on the server's event loop.

Behaves as Triton's HTTPMetricsServer: `GET /metrics` answers the Prometheus text; any other
GET path answers 200 with an empty body; any other method answers 405
`{"error":"Method Not Allowed"}`. Oceanus adds the live status page (`GET /`, its two files and
`GET /status.json`; frontends/metrics/page.py) unless `--allow-status-page=false`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from prometheus_client.registry import CollectorRegistry

from oceanus.core.observability import statistics
from oceanus.core.observability.latency import LatencyRecorder
from oceanus.core.server import ServerCore
from oceanus.frontends.metrics.collector import TritonCollector
from oceanus.frontends.metrics.config import MetricsConfig
from oceanus.frontends.metrics.exposition import CONTENT_TYPE, render
from oceanus.frontends.metrics.page import SECURITY_HEADERS, StatusPage
from oceanus.frontends.metrics.status import StatusSource
from oceanus.frontends.metrics.system import SystemMetrics

log = logging.getLogger("oceanus.metrics")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass
class MetricsOptions:
    address: str = "0.0.0.0"
    port: int = 8002
    interval_ms: int = 2000
    allow_cpu: bool = True
    allow_gpu: bool = True
    config: MetricsConfig = field(default_factory=MetricsConfig)
    # The live status page (`GET /`, `/status.json`); `server_id` and the ports whose open
    # connections it counts (port -> "http"/"grpc", read when the page polls).
    status_page: bool = True
    server_id: str = "triton"
    ports: Callable[[], Mapping[int, str]] = dict


def enable_latency_recording(config: MetricsConfig) -> None:
    """Make every model version loaded from now on keep the latency distributions that
    `config` asks for (summaries, histogram); call before the core loads models."""
    options = config.latency_options()
    statistics.set_latency_factory((lambda: LatencyRecorder(options)) if options.enabled else None)


class MetricsApp:
    """ASGI application serving the registry's families in Triton's text format."""

    def __init__(self, registry: CollectorRegistry, page: StatusPage | None = None) -> None:
        self.registry = registry
        self.page = page

    def body(self) -> bytes:
        return render(self.registry.collect())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] != "GET":
            await _reply(send, 405, b"application/json", b'{"error":"Method Not Allowed"}')
            return
        path = scope["path"]
        if self.page is not None and self.page.serves(path):
            reply = await self.page.reply(path)
            await _reply(send, 200, reply.content_type.encode(), reply.body, SECURITY_HEADERS)
            return
        body = self.body() if path == "/metrics" else b""
        await _reply(send, 200, CONTENT_TYPE.encode(), body)


async def _reply(
    send: Send,
    status: int,
    content_type: bytes,
    body: bytes,
    extra: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
                *extra,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class MetricsFrontend:
    def __init__(self, core: ServerCore, options: MetricsOptions) -> None:
        self.core = core
        self.options = options
        self.system: SystemMetrics | None = None
        if options.allow_cpu or options.allow_gpu:
            self.system = SystemMetrics(options.interval_ms, options.allow_cpu, options.allow_gpu)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(
            TritonCollector(core, options.config, self.system, custom=core.custom_metrics)
        )
        page = None
        if options.status_page:
            page = StatusPage(StatusSource(core, options.server_id, self.system, options.ports))
        self.app = MetricsApp(self.registry, page)
        self._server: uvicorn.Server | None = None
        self._loop_task: asyncio.Task[None] | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.options.address}:{self.options.port}"

    async def start(self) -> None:
        if self.system is not None:
            # The first /proc and NVML reads (NVML init can take a while) off the loop.
            await asyncio.get_running_loop().run_in_executor(None, self.system.start)
        config = uvicorn.Config(
            self.app,
            host=self.options.address,
            port=self.options.port,
            loop="none",
            http="httptools",
            lifespan="off",
            access_log=False,
            log_level="warning",
            server_header=False,
            date_header=False,
        )
        config.load()
        server = uvicorn.Server(config)
        server.lifespan = config.lifespan_class(config)
        await server.startup()
        if server.should_exit:
            await self._stop_system()
            raise OSError(f"failed to start Metrics Service on {self.endpoint}")
        self._server = server
        self._loop_task = asyncio.create_task(server.main_loop())

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.should_exit = True
            if self._loop_task is not None:
                await self._loop_task
                self._loop_task = None
            await server.shutdown()
        await self._stop_system()

    async def _stop_system(self) -> None:
        if self.system is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.system.stop)
