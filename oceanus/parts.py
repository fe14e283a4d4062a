"""Each part's options from the settings, one function per part: the core, the gRPC frontend
(and its transport's limits), HTTP and metrics. The server process (main.py), the frontend
worker processes and the in-process API (oceanus/embedded) all build their parts here, so the
three serve alike; a unit is converted here once (the gRPC flags' milliseconds to the
transport's seconds), never again downstream.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from oceanus.backends import builtin
from oceanus.core.observability.tracing import SpanExporter
from oceanus.core.server import CoreOptions, ServerCore
from oceanus.frontends.grpc.server import MAX_MESSAGE_SIZE, GrpcOptions
from oceanus.frontends.grpc_transport.server import Limits
from oceanus.frontends.http.app import HttpFrontend
from oceanus.frontends.http.protocol import Handler, HttpServer
from oceanus.frontends.metrics import MetricsOptions, parse_metrics_config
from oceanus.settings import Settings
from oceanus.storage import RepositorySet

# Extensions listed by server metadata (HTTP and gRPC), in Triton 2.51's order. The CUDA shared
# memory calls are answered (with Triton's errors: no CUDA IPC here), so it is listed too.
HTTP_EXTENSIONS = [
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "cuda_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
]


def core_options(
    settings: Settings, repositories: RepositorySet, exporter: SpanExporter | None
) -> CoreOptions:
    """The core's options: one place for the process and the in-process API, so both cores
    behave alike."""
    return CoreOptions(
        repositories=repositories.folders,
        refresh_repositories=repositories.refresh if repositories.mirrors else None,
        backends=builtin.registry(backend_config=settings.backend_config),
        autocomplete=settings.autocomplete,
        strict_readiness=settings.strict_readiness,
        load_threads=settings.model_load_thread_count or 1,
        control_mode=settings.model_control_mode,
        startup_models=settings.load_models,
        poll_seconds=max(settings.repository_poll_secs, 1),
        extensions=list(HTTP_EXTENSIONS),
        trace=settings.trace,
        span_exporter=exporter,
        response_cache_size=settings.response_cache_size,
        rate_limit=settings.rate_limit,
        rate_limit_resources=settings.rate_limit_resources,
        model_namespacing=settings.model_namespacing,
    )


def _seconds(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000


def grpc_limits(settings: Settings) -> Limits:
    """What each gRPC connection enforces: the `--grpc-*` keepalive, ping and age flags, in
    milliseconds as Triton spells them, here (and only here) in the transport's seconds."""
    return Limits(
        max_message=MAX_MESSAGE_SIZE,
        keepalive_time_s=settings.grpc_keepalive_time / 1000,
        keepalive_timeout_s=settings.grpc_keepalive_timeout / 1000,
        permit_without_calls=settings.grpc_keepalive_permit_without_calls,
        max_pings_without_data=settings.grpc_http2_max_pings_without_data,
        min_ping_interval_s=settings.grpc_http2_min_recv_ping_interval_without_data / 1000,
        max_ping_strikes=settings.grpc_http2_max_ping_strikes,
        max_age_s=_seconds(settings.grpc_max_connection_age),
        age_grace_s=_seconds(settings.grpc_max_connection_age_grace),
        max_concurrent_streams=settings.grpc_max_concurrent_streams,
    )


def grpc_options(
    settings: Settings,
    reuse_port: bool | None = None,
    address: str | None = None,
    port: int | None = None,
) -> GrpcOptions:
    """The gRPC frontend's options (an attached frontend may name its own address and port)."""
    return GrpcOptions(
        address=settings.grpc_address if address is None else address,
        port=settings.grpc_port if port is None else port,
        reuse_port=settings.reuse_grpc_port if reuse_port is None else reuse_port,
        limits=grpc_limits(settings),
        restricted=settings.grpc_restricted_protocols,
        use_ssl=settings.grpc_use_ssl,
        use_ssl_mutual=settings.grpc_use_ssl_mutual,
        server_cert=settings.grpc_server_cert,
        server_key=settings.grpc_server_key,
        root_cert=settings.grpc_root_cert,
    )


def http_frontend(
    settings: Settings,
    core: ServerCore,
    openai_routes: Any = None,
    restricted: dict[str, tuple[str, str]] | None = None,
    header_forward_pattern: str | None = None,
) -> HttpFrontend:
    """The KServe HTTP routes (an attached frontend may name its own restrictions and
    forwarded headers)."""
    return HttpFrontend(
        core,
        settings.http_max_input_size,
        settings.log,
        settings.http_restricted_apis if restricted is None else restricted,
        settings.http_header_forward_pattern
        if header_forward_pattern is None
        else header_forward_pattern,
        openai_routes,
    )


def http_server(settings: Settings, handle: Handler, busy_poll: bool = True) -> HttpServer:
    """An HTTP server for `handle` with the `--http-*` limits (`busy_poll`: --http-busy-poll-us
    applies; the OpenAI port's long generations gain nothing from it)."""
    return HttpServer(
        handle, settings.http_max_input_size, settings.http_busy_poll_us if busy_poll else 0
    )


def metrics_options(
    settings: Settings,
    address: str | None = None,
    port: int | None = None,
    ports: Callable[[], Mapping[int, str]] = dict,
) -> MetricsOptions:
    """The metrics frontend's options (`ports`: those the status page counts connections of)."""
    return MetricsOptions(
        address=settings.metrics_address if address is None else address,
        port=settings.metrics_port if port is None else port,
        interval_ms=settings.metrics_interval_ms,
        allow_cpu=settings.allow_cpu_metrics,
        allow_gpu=settings.allow_gpu_metrics,
        config=parse_metrics_config(settings.metrics_config),
        status_page=settings.allow_status_page,
        server_id=settings.server_id,
        ports=ports,
    )
