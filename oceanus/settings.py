"""Everything the server is told at start, as one typed object: each field declared once, with
Triton's flag name, type, unit, default and help (oceanus/declaration.py). The command line
(cli.py) and `oceanus.Server(**keywords)` (embedded/options.py) are generated from these
fields; each part's options are derived from them in oceanus/parts.py.

Values keep the flag's unit (`grpc_keepalive_time` is milliseconds, as `--grpc-keepalive-time`
says); the few fields that several flags decide together (`trace`, `log`, `autocomplete`,
`response_cache_size`) are derived after init, so there is one reading of each flag.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from oceanus.core.observability.tracing import TraceConfig
from oceanus.core.response_cache import parse_cache_config
from oceanus.core.scheduling.rate_limiter import ResourceLimit, parse_mode, parse_resource
from oceanus.declaration import (
    BOOL,
    COUNT,
    GROUPS,
    MS,
    PORT,
    checked,
    choice,
    parse_bool,
    parse_regex,
    parse_workers,
    setting,
)
from oceanus.frontends.http.busy_poll import DEFAULT_BUDGET_US
from oceanus.frontends.restricted import GRPC_HEADER_PREFIX, parse_restriction
from oceanus.logs import LogSettings
from oceanus.trace_flags import trace_config_from_flags

# tritonserver flags accepted for compatibility whose features Oceanus does not implement (on
# the command line and as keywords: such launch lines still start, with a warning).
IGNORED_FLAGS = (
    "--backend-directory",
    "--repoagent-directory",
    "--cache-directory",
    "--pinned-memory-pool-byte-size",
    "--cuda-memory-pool-byte-size",
    "--buffer-manager-thread-count",
    "--host-policy",
    "--min-supported-compute-capability",
    "--http-thread-count",
    "--grpc-infer-allocation-pool-size",
    "--grpc-max-response-pool-size",
    "--grpc-infer-thread-count",
    "--grpc-infer-response-compression-level",
    "--reuse-http-port",
    "--enable-peer-access",
    "--log-mode",
)

RESTRICTED_GROUPS = (
    "health, metadata, inference, shared-memory, model-config, model-repository, statistics, "
    "trace, logging"
)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"value must be at least 1, got {value}")
    return value


def _restrictions(option: str, feature: str, prefix: str) -> Callable[[list[str]], Any]:
    """Repeated `<groups>:<key>=<value>` values into category -> (header, value)."""

    def combine(values: list[str]) -> dict[str, tuple[str, str]]:
        restricted: dict[str, tuple[str, str]] = {}
        for value in values:
            parse_restriction(value, option, feature, prefix, restricted)
        return restricted

    return combine


def _metrics_pairs(values: list[str]) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--metrics-config expects <setting>=<value>, got '{item}'")
        pairs[key.strip()] = value.strip().strip('"')
    return pairs


M, HTTP, GRPC, METRICS, LOG, TRACE, SCHED, OCEANUS = GROUPS


@dataclass
class Settings:
    # ---- models and the repository
    model_repositories: list[str] = setting(
        [],
        ("--model-repository", "--model-store"),
        "model repository folder or s3://, gs://, as:// URL (repeatable); default: the "
        "built-in example repository",
        M,
        repeat=True,
        metavar="PATH",
    )
    model_control_mode: str = setting(
        "none",
        "--model-control-mode",
        "none: load every model at start; poll: follow the repository; explicit: load and "
        "unload on request (--load-model at start)",
        M,
        parse=choice("none", "poll", "explicit", lower=True),
        metavar="none|poll|explicit",
    )
    load_models: list[str] = setting(
        [], "--load-model", "model to load at start in explicit mode (repeatable)", M, repeat=True
    )
    repository_poll_secs: int = setting(
        15, "--repository-poll-secs", "poll mode's interval", M, unit="s", **COUNT
    )
    model_load_thread_count: int = setting(
        4, "--model-load-thread-count", "models loaded at once", M, **COUNT
    )
    disable_auto_complete_config: bool = setting(
        False,
        "--disable-auto-complete-config",
        "do not fill missing config fields from the model files",
        M,
        parse=parse_bool,
        bare=True,
    )
    strict_model_config: bool | None = setting(
        None,
        "--strict-model-config",
        "deprecated: true means --disable-auto-complete-config",
        M,
        kind=bool,
        **BOOL,
    )
    exit_on_error: bool = setting(True, "--exit-on-error", "exit if any model fails", M, **BOOL)
    strict_readiness: bool = setting(
        True, "--strict-readiness", "server ready only when every model is ready", M, **BOOL
    )
    exit_timeout_secs: int = setting(
        30, "--exit-timeout-secs", "time in-flight requests get at exit", M, unit="s", **COUNT
    )
    backend_config: list[str] = setting(
        [],
        "--backend-config",
        "a backend's setting (repeatable)",
        M,
        repeat=True,
        metavar="<backend>,<setting>=<value>",
    )
    model_namespacing: bool = setting(
        False,
        "--model-namespacing",
        "the same model name may live in several repositories",
        M,
        parse=parse_bool,
        metavar="BOOL",
    )
    server_id: str = setting("triton", "--id", "the server's name in its metadata", M)
    # ---- HTTP/REST
    allow_http: bool = setting(True, "--allow-http", "serve HTTP/REST", HTTP, **BOOL)
    http_port: int = setting(8000, "--http-port", "HTTP port (0: any free port)", HTTP, **PORT)
    http_address: str = setting("0.0.0.0", "--http-address", "HTTP address", HTTP)
    http_max_input_size: int = setting(
        64 * 1024 * 1024,
        "--http-max-input-size",
        "largest request body",
        HTTP,
        unit="bytes",
        **COUNT,
    )
    # restricted category -> (header name, value)
    http_restricted_apis: dict[str, tuple[str, str]] = setting(
        {},
        "--http-restricted-api",
        f"API groups ({RESTRICTED_GROUPS}) that need the header '<key>: <value>' (repeatable)",
        HTTP,
        repeat=True,
        combine=_restrictions("http-restricted-api", "api", ""),
        metavar="<apis>:<key>=<value>",
    )
    # Headers matching these regexes (case-insensitive, anywhere in the name) reach the model
    # as request parameters ("": none).
    http_header_forward_pattern: str = setting(
        "",
        "--http-header-forward-pattern",
        "headers passed to models",
        HTTP,
        parse=parse_regex,
        metavar="REGEX",
    )
    # ---- gRPC (times in milliseconds, as Triton's flags; Triton's defaults)
    allow_grpc: bool = setting(True, "--allow-grpc", "serve gRPC", GRPC, **BOOL)
    grpc_port: int = setting(8001, "--grpc-port", "gRPC port (0: any free port)", GRPC, **PORT)
    grpc_address: str = setting("0.0.0.0", "--grpc-address", "gRPC address", GRPC)
    reuse_grpc_port: bool = setting(
        False, "--reuse-grpc-port", "let several servers listen on the gRPC port", GRPC, **BOOL
    )
    grpc_header_forward_pattern: str = setting(
        "",
        "--grpc-header-forward-pattern",
        "metadata passed to models",
        GRPC,
        parse=parse_regex,
        metavar="REGEX",
    )
    grpc_keepalive_time: int = setting(
        7_200_000, "--grpc-keepalive-time", "keepalive ping period", GRPC, **MS
    )
    grpc_keepalive_timeout: int = setting(
        20_000,
        "--grpc-keepalive-timeout",
        "time a keepalive ping's answer may take",
        GRPC,
        **MS,
    )
    grpc_keepalive_permit_without_calls: bool = setting(
        False,
        "--grpc-keepalive-permit-without-calls",
        "allow keepalive pings without calls in flight",
        GRPC,
        **BOOL,
    )
    grpc_http2_max_pings_without_data: int = setting(
        2,
        "--grpc-http2-max-pings-without-data",
        "pings sent without data between (0: no limit)",
        GRPC,
        **COUNT,
    )
    grpc_http2_min_recv_ping_interval_without_data: int = setting(
        300_000,
        "--grpc-http2-min-recv-ping-interval-without-data",
        "shortest interval between a client's pings without data",
        GRPC,
        **MS,
    )
    grpc_http2_max_ping_strikes: int = setting(
        2,
        "--grpc-http2-max-ping-strikes",
        "bad pings before the connection is closed (0: no limit)",
        GRPC,
        **COUNT,
    )
    grpc_max_concurrent_streams: int = setting(
        1000,
        "--grpc-max-concurrent-streams",
        "calls a connection may have open at once (announced; more are refused)",
        GRPC,
        parse=checked(_positive),
        kind=int,
    )
    grpc_max_connection_age: int | None = setting(
        None, "--grpc-max-connection-age", "connection lifetime (default: none)", GRPC, **MS
    )
    grpc_max_connection_age_grace: int | None = setting(
        None,
        "--grpc-max-connection-age-grace",
        "time calls get once a connection is too old (default: none)",
        GRPC,
        **MS,
    )
    # restricted category -> (metadata key, value)
    grpc_restricted_protocols: dict[str, tuple[str, str]] = setting(
        {},
        "--grpc-restricted-protocol",
        f"RPC groups ({RESTRICTED_GROUPS}) that need the metadata "
        "'triton-grpc-protocol-<key>: <value>' (repeatable)",
        GRPC,
        repeat=True,
        combine=_restrictions("grpc-restricted-protocol", "protocol", GRPC_HEADER_PREFIX),
        metavar="<protocols>:<key>=<value>",
    )
    grpc_use_ssl: bool = setting(False, "--grpc-use-ssl", "serve gRPC over TLS", GRPC, **BOOL)
    grpc_use_ssl_mutual: bool = setting(
        False, "--grpc-use-ssl-mutual", "serve gRPC over mutual TLS", GRPC, **BOOL
    )
    grpc_server_cert: str = setting("", "--grpc-server-cert", "PEM file", GRPC, metavar="PEM")
    grpc_server_key: str = setting("", "--grpc-server-key", "PEM file", GRPC, metavar="PEM")
    grpc_root_cert: str = setting("", "--grpc-root-cert", "PEM file", GRPC, metavar="PEM")
    # ---- metrics
    allow_metrics: bool = setting(
        True, "--allow-metrics", "serve Prometheus metrics", METRICS, **BOOL
    )
    allow_gpu_metrics: bool = setting(
        True, "--allow-gpu-metrics", "report GPU metrics", METRICS, **BOOL
    )
    allow_cpu_metrics: bool = setting(
        True, "--allow-cpu-metrics", "report CPU metrics", METRICS, **BOOL
    )
    metrics_port: int = setting(8002, "--metrics-port", "metrics port", METRICS, **PORT)
    # "": --http-address when HTTP is served, else 0.0.0.0 (as Triton); resolved after init.
    metrics_address: str = setting(
        "",
        "--metrics-address",
        "default: --http-address when HTTP is served, else 0.0.0.0 (as Triton)",
        METRICS,
    )
    metrics_interval_ms: int = setting(
        2000, "--metrics-interval-ms", "GPU/CPU metrics refresh", METRICS, **MS
    )
    # <setting> -> <value> (frontends/metrics/config.py reads them)
    metrics_config: dict[str, str] = setting(
        {},
        "--metrics-config",
        "metrics families: counter_latencies=false, summary_latencies=true, "
        "histogram_latencies=true, summary_quantiles=<q>:<error>,... (repeatable)",
        METRICS,
        repeat=True,
        combine=_metrics_pairs,
        metavar="<setting>=<value>",
    )
    # ---- logging (read together into `log`)
    log_verbose: int = setting(0, "--log-verbose", "verbose logging level", LOG, **COUNT)
    log_info: bool = setting(True, "--log-info", "log info messages", LOG, **BOOL)
    log_warning: bool = setting(True, "--log-warning", "log warnings", LOG, **BOOL)
    log_error: bool = setting(True, "--log-error", "log errors", LOG, **BOOL)
    log_format: str = setting(
        "default",
        "--log-format",
        "line format",
        LOG,
        parse=choice("default", "ISO8601"),
        metavar="default|ISO8601",
    )
    log_file: str = setting("", "--log-file", "log to this file instead of stderr", LOG)
    # ---- tracing (read together into `trace`, by oceanus/trace_flags.py)
    trace_config: list[str] = setting(
        [],
        "--trace-config",
        "trace settings: level=TIMESTAMPS|TENSORS|OFF, rate=N, count=N, "
        "mode=triton|opentelemetry, triton,file=PATH, triton,log-frequency=N, "
        "opentelemetry,url=URL, opentelemetry,resource=K=V (repeatable)",
        TRACE,
        repeat=True,
        metavar="[<mode>,]<setting>=<value>",
    )
    trace_level: list[str] = setting(
        [], "--trace-level", "deprecated: --trace-config level=", TRACE, repeat=True
    )
    trace_rate: str | None = setting(
        None, "--trace-rate", "deprecated: --trace-config rate=", TRACE
    )
    trace_count: str | None = setting(
        None, "--trace-count", "deprecated: --trace-config count=", TRACE
    )
    trace_file: str | None = setting(
        None, "--trace-file", "deprecated: --trace-config triton,file=", TRACE
    )
    trace_log_frequency: str | None = setting(
        None, "--trace-log-frequency", "deprecated: --trace-config triton,log-frequency=", TRACE
    )
    # ---- scheduling and the response cache (docs/rate-limiter.md, docs/response-cache.md)
    rate_limit: str = setting(
        "off",
        "--rate-limit",
        "rate limiter mode",
        SCHED,
        parse=checked(parse_mode),
        metavar="execution_count|off",
    )
    rate_limit_resources: list[ResourceLimit] = setting(
        [],
        "--rate-limit-resource",
        "a resource's count (repeatable)",
        SCHED,
        kind=ResourceLimit,
        parse=checked(parse_resource),
        repeat=True,
        metavar="<name>:<count>[:<device>]",
    )
    cache_config: list[str] = setting(
        [],
        "--cache-config",
        "response cache: local,size=<bytes> (repeatable; see docs/response-cache.md)",
        SCHED,
        repeat=True,
        metavar="<cache>,<key>=<value>",
    )
    response_cache_byte_size: int | None = setting(
        None,
        "--response-cache-byte-size",
        "deprecated: --cache-config local,size=<bytes>",
        SCHED,
        metavar="BYTES",
        **COUNT,
    )
    # ---- Oceanus' own
    allow_status_page: bool = setting(
        True,
        "--allow-status-page",
        "serve the live status page at / on the metrics port (docs/status-page.md)",
        OCEANUS,
        **BOOL,
    )
    # After an HTTP response, poll this long for the next request before sleeping (0: never).
    http_busy_poll_us: int = setting(
        DEFAULT_BUDGET_US,
        "--http-busy-poll-us",
        "after an HTTP response, poll this long for the next request instead of sleeping, "
        "when requests come that close together (lower latency for CPU time; 0: off)",
        OCEANUS,
        unit="us",
        metavar="US",
        **COUNT,
    )
    # Processes serving HTTP and gRPC beside the core process (0: all in one process; None:
    # `auto`, one per usable CPU, none below 3 CPUs).
    frontend_workers: int | None = setting(
        None,
        "--frontend-workers",
        "processes that serve HTTP and gRPC on the shared ports and hand decoded requests to "
        "the one core process (default auto: one per usable CPU, none below 3 CPUs; 0: one "
        "process)",
        OCEANUS,
        kind=int,
        parse=parse_workers,
        metavar="N|auto",
    )
    # The OpenAI-compatible API (docs/openai.md): also on its own port (None: only on the HTTP
    # port); --chat-template: a template (or its file) for every model instead of their own.
    openai_port: int | None = setting(
        None,
        "--openai-port",
        "also serve the OpenAI-compatible API (/v1/...) on this port (Triton's OpenAI "
        "frontend listens on 9000); it is always on the HTTP port (docs/openai.md)",
        OCEANUS,
        **PORT,
    )
    chat_template: str | None = setting(
        None,
        "--chat-template",
        "a Jinja chat template (or its file) for the OpenAI chat route, instead of each "
        "model's own",
        OCEANUS,
        metavar="TEMPLATE|FILE",
    )
    # ---- derived after init from the flags above (one reading of each)
    autocomplete: bool = field(init=False)
    response_cache_size: int = field(init=False)  # the `local` cache's bytes; 0: none
    trace: TraceConfig = field(init=False)
    # The live log settings: the logging endpoints change this object at run time.
    log: LogSettings = field(init=False)

    def __post_init__(self) -> None:
        """Derive what several flags decide together; ValueError (Triton's words) if they
        disagree."""
        if (self.grpc_use_ssl or self.grpc_use_ssl_mutual) and not (
            self.grpc_server_cert and self.grpc_server_key
        ):
            raise ValueError("--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key")
        self.autocomplete = not self.disable_auto_complete_config and not self.strict_model_config
        cache = parse_cache_config(self.cache_config, self.response_cache_byte_size)
        self.response_cache_size = cache.local_size()
        self.trace = trace_config_from_flags(
            self.trace_config,
            self.trace_level,
            self.trace_rate,
            self.trace_count,
            self.trace_file,
            self.trace_log_frequency,
        )
        self.log = LogSettings(
            verbose=self.log_verbose,
            info=self.log_info,
            warning=self.log_warning,
            error=self.log_error,
            format=self.log_format,
            file=self.log_file,
        )
        if not self.metrics_address:
            self.metrics_address = self.http_address if self.allow_http else "0.0.0.0"

    def warnings(self) -> list[str]:
        """What is accepted but not done as asked (logged once, where the settings are read)."""
        said = []
        if self.response_cache_byte_size is not None:
            said.append("--response-cache-byte-size is deprecated: use --cache-config local,size=N")
        caches = parse_cache_config(self.cache_config, self.response_cache_byte_size).caches
        for name in caches:
            if name != "local":
                said.append(
                    f"cache implementation '{name}' is not available (only 'local'); ignoring it"
                )
        return said
