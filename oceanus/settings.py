"""Everything the server is told at start, as one typed object (filled by the CLI)."""

from __future__ import annotations

from dataclasses import dataclass, field

from oceanus.core.observability.tracing import TraceConfig
from oceanus.core.scheduling.rate_limiter import ResourceLimit
from oceanus.frontends.grpc import keepalive
from oceanus.frontends.http.busy_poll import DEFAULT_BUDGET_US
from oceanus.logs import LogSettings


@dataclass
class Settings:
    model_repositories: list[str] = field(default_factory=list)
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    http_address: str = "0.0.0.0"
    grpc_address: str = "0.0.0.0"
    metrics_address: str = "0.0.0.0"
    allow_http: bool = True
    allow_grpc: bool = True
    allow_metrics: bool = True
    allow_gpu_metrics: bool = True
    allow_cpu_metrics: bool = True
    # Oceanus' live status page on the metrics port (GET /, docs/status-page.md).
    allow_status_page: bool = True
    metrics_interval_ms: int = 2000
    # --metrics-config <setting>=<value> pairs (frontends/metrics/config.py reads them)
    metrics_config: dict[str, str] = field(default_factory=dict)
    autocomplete: bool = True
    exit_on_error: bool = True
    strict_readiness: bool = True
    exit_timeout_secs: int = 30
    http_max_input_size: int = 64 * 1024 * 1024
    # After an HTTP response, poll this long for the next request before sleeping (0: never).
    http_busy_poll_us: int = DEFAULT_BUDGET_US
    # Processes serving HTTP and gRPC beside the core process (0: all in one process; None:
    # `auto`, one per usable CPU, none below 3 CPUs).
    frontend_workers: int | None = None
    model_control_mode: str = "none"
    load_models: list[str] = field(default_factory=list)
    repository_poll_secs: int = 15
    model_load_thread_count: int = 4
    backend_config: list[str] = field(default_factory=list)
    # The `local` response cache's size in bytes (--cache-config local,size=N); 0: no cache.
    response_cache_size: int = 0
    server_id: str = "triton"
    # --rate-limit and --rate-limit-resource (docs/rate-limiter.md)
    rate_limit: str = "off"
    rate_limit_resources: list[ResourceLimit] = field(default_factory=list)
    # --http/grpc-header-forward-pattern: headers matching these regexes (case-insensitive,
    # anywhere in the name) reach the model as request parameters ("" : none).
    http_header_forward_pattern: str = ""
    grpc_header_forward_pattern: str = ""
    # --model-namespacing: the same model name may live in several repositories.
    model_namespacing: bool = False
    # The OpenAI-compatible API (docs/openai.md): also on its own port (None: only on the HTTP
    # port); --chat-template: a template (or its file) for every model instead of their own.
    openai_port: int | None = None
    chat_template: str | None = None
    log: LogSettings = field(default_factory=LogSettings)
    trace: TraceConfig = field(default_factory=TraceConfig)
    # gRPC frontend (Triton's --grpc-* flags; times in milliseconds)
    reuse_grpc_port: bool = False
    grpc_keepalive_time: int = keepalive.KEEPALIVE_TIME_MS
    grpc_keepalive_timeout: int = keepalive.KEEPALIVE_TIMEOUT_MS
    grpc_keepalive_permit_without_calls: bool = False
    grpc_http2_max_pings_without_data: int = keepalive.HTTP2_MAX_PINGS_WITHOUT_DATA
    grpc_http2_min_recv_ping_interval_without_data: int = (
        keepalive.HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS
    )
    grpc_http2_max_ping_strikes: int = keepalive.HTTP2_MAX_PING_STRIKES
    grpc_max_connection_age: int | None = None
    grpc_max_connection_age_grace: int | None = None
    # restricted category -> (header name, value), from --http-restricted-api
    http_restricted_apis: dict[str, tuple[str, str]] = field(default_factory=dict)
    # restricted category -> (metadata key, value), from --grpc-restricted-protocol
    grpc_restricted_protocols: dict[str, tuple[str, str]] = field(default_factory=dict)
    grpc_use_ssl: bool = False
    grpc_use_ssl_mutual: bool = False
    grpc_server_cert: str = ""
    grpc_server_key: str = ""
    grpc_root_cert: str = ""
