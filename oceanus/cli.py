"""`oceanus` command line: tritonserver's flags, names, defaults and meanings.

A Triton launch line works after swapping the binary. Flags of features Oceanus does not have
are accepted with a warning rather than refused, so such launch lines still start.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import NoReturn

from oceanus import __version__
from oceanus.cli_groups import (
    flag,
    grpc_options,
    parse_bool,
    parse_nonnegative,
    scheduling_options,
    trace_options,
)
from oceanus.core.response_cache import parse_cache_config
from oceanus.frontends.http.busy_poll import DEFAULT_BUDGET_US
from oceanus.logs import LogSettings
from oceanus.settings import Settings
from oceanus.trace_flags import trace_config_from_flags

log = logging.getLogger("oceanus.cli")

# tritonserver flags accepted for compatibility whose features Oceanus does not implement.
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


def parse_workers(text: str) -> int | None:
    """`--frontend-workers`: a count, or `auto` (None)."""
    if text.strip().lower() == "auto":
        return None
    try:
        count = int(text)
    except ValueError:
        count = -1
    if count < 0:
        raise argparse.ArgumentTypeError(f"expected a number of workers or 'auto', got '{text}'")
    return count


def parse_port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port '{text}'") from None
    if not -1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is out of range")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One clear line and exit code 2, not argparse's usage block."""
        self.exit(2, f"oceanus: error: {message} (see 'oceanus --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="oceanus",
        description="Oceanus: an inference server that speaks NVIDIA Triton's protocols. "
        "Takes tritonserver's flags.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"oceanus {__version__}")
    add = parser.add_argument
    add(
        "--model-repository",
        "--model-store",
        dest="model_repositories",
        action="append",
        default=[],
        metavar="PATH",
        help="model repository folder (repeatable); default: the built-in example repository",
    )
    add("--http-port", type=parse_port, default=8000)
    add("--grpc-port", type=parse_port, default=8001)
    add("--metrics-port", type=parse_port, default=8002)
    add(
        "--openai-port",
        type=parse_port,
        default=None,
        help="Oceanus: also serve the OpenAI-compatible API (/v1/...) on this port (Triton's "
        "OpenAI frontend listens on 9000); it is always on the HTTP port (docs/openai.md)",
    )
    add(
        "--chat-template",
        default=None,
        metavar="TEMPLATE|FILE",
        help="Oceanus: a Jinja chat template (or its file) for the OpenAI chat route, instead "
        "of each model's own",
    )
    add("--http-address", default="0.0.0.0")
    add("--grpc-address", default="0.0.0.0")
    add(
        "--metrics-address",
        default=None,
        help="default: --http-address when HTTP is served, else 0.0.0.0 (as Triton)",
    )
    flag(parser, "--allow-http", True, "serve HTTP/REST")
    flag(parser, "--allow-grpc", True, "serve gRPC")
    flag(parser, "--allow-metrics", True, "serve Prometheus metrics")
    flag(parser, "--allow-gpu-metrics", True, "report GPU metrics")
    flag(parser, "--allow-cpu-metrics", True, "report CPU metrics")
    flag(
        parser,
        "--allow-status-page",
        True,
        "Oceanus: serve the live status page at / on the metrics port (docs/status-page.md)",
    )
    add("--metrics-interval-ms", type=parse_nonnegative, default=2000)
    add(
        "--metrics-config",
        dest="metrics_config",
        action="append",
        default=[],
        metavar="<setting>=<value>",
        help="metrics families: counter_latencies=false, summary_latencies=true, "
        "histogram_latencies=true, summary_quantiles=<q>:<error>,... (repeatable)",
    )
    add(
        "--disable-auto-complete-config",
        action="store_true",
        help="do not fill missing config fields from the model files",
    )
    add(
        "--strict-model-config",
        type=parse_bool,
        nargs="?",
        const=True,
        default=None,
        metavar="BOOL",
        help="deprecated: true means --disable-auto-complete-config",
    )
    flag(parser, "--exit-on-error", True, "exit if any model fails to load")
    flag(parser, "--strict-readiness", True, "server ready only when every model is ready")
    add("--exit-timeout-secs", type=parse_nonnegative, default=30)
    add("--http-max-input-size", type=parse_nonnegative, default=64 * 1024 * 1024)
    add(
        "--http-busy-poll-us",
        type=parse_nonnegative,
        default=DEFAULT_BUDGET_US,
        metavar="US",
        help="Oceanus: after an HTTP response, poll up to this long for the next request "
        "instead of sleeping, when requests come that close together (lower latency for CPU "
        f"time; 0: off; default {DEFAULT_BUDGET_US})",
    )
    add(
        "--frontend-workers",
        type=parse_workers,
        default=None,
        metavar="N|auto",
        help="Oceanus: processes that serve HTTP and gRPC on the shared ports and hand decoded "
        "requests to the one core process (default auto: one per usable CPU, none below 3 "
        "CPUs; 0: one process)",
    )
    add(
        "--http-restricted-api",
        action="append",
        default=[],
        metavar="<apis>:<key>=<value>",
        help="API groups (health, metadata, inference, shared-memory, model-config, "
        "model-repository, statistics, trace, logging) that need the header '<key>: <value>'",
    )
    # Triton reads the mode case-insensitively (charts pass --model-control-mode=POLL).
    add(
        "--model-control-mode",
        type=str.lower,
        choices=("none", "poll", "explicit"),
        default="none",
    )
    add("--load-model", dest="load_models", action="append", default=[])
    add("--repository-poll-secs", type=parse_nonnegative, default=15)
    add("--model-load-thread-count", type=parse_nonnegative, default=4)
    add("--backend-config", action="append", default=[])
    add(
        "--cache-config",
        dest="cache_config",
        action="append",
        default=[],
        metavar="<cache>,<key>=<value>",
        help="response cache: local,size=<bytes> (repeatable; see docs/response-cache.md)",
    )
    add(
        "--response-cache-byte-size",
        type=parse_nonnegative,
        default=None,
        metavar="BYTES",
        help="deprecated: --cache-config local,size=<bytes>",
    )
    add("--id", dest="server_id", default="triton")
    add("--log-verbose", type=parse_nonnegative, default=0)
    flag(parser, "--log-info", True, "log info messages")
    flag(parser, "--log-warning", True, "log warnings")
    flag(parser, "--log-error", True, "log errors")
    add("--log-format", choices=("default", "ISO8601"), default="default")
    add("--log-file", default="")
    grpc_options(parser)
    trace_options(parser)
    scheduling_options(parser)
    for name in IGNORED_FLAGS:
        dest = "ignored_" + name[2:].replace("-", "_")
        add(name, dest=dest, action="append", help=argparse.SUPPRESS)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> tuple[Settings, list[str]]:
    """Settings from the command line, plus the ignored flags that were given."""
    parser = build_parser()
    args = parser.parse_args(argv)
    from oceanus.frontends.restricted import GRPC_HEADER_PREFIX, parse_restriction

    restricted: dict[str, tuple[str, str]] = {}
    http_restricted: dict[str, tuple[str, str]] = {}
    try:
        for value in args.grpc_restricted_protocol:
            parse_restriction(
                value, "grpc-restricted-protocol", "protocol", GRPC_HEADER_PREFIX, restricted
            )
        for value in args.http_restricted_api:
            parse_restriction(value, "http-restricted-api", "api", "", http_restricted)
    except ValueError as exc:
        parser.error(str(exc))
    if (args.grpc_use_ssl or args.grpc_use_ssl_mutual) and not (
        args.grpc_server_cert and args.grpc_server_key
    ):
        parser.error("--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key")
    autocomplete = not args.disable_auto_complete_config
    if args.strict_model_config is not None:
        autocomplete = autocomplete and not args.strict_model_config
    metrics_config: dict[str, str] = {}
    for item in args.metrics_config:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--metrics-config expects <setting>=<value>, got '{item}'")
        metrics_config[key.strip()] = value.strip().strip('"')
    try:
        trace = trace_config_from_flags(
            args.trace_config,
            args.trace_level,
            args.trace_rate,
            args.trace_count,
            args.trace_file,
            args.trace_log_frequency,
        )
    except ValueError as exc:
        parser.error(str(exc))
    try:
        cache = parse_cache_config(args.cache_config, args.response_cache_byte_size)
    except ValueError as exc:
        parser.error(str(exc))
    if args.response_cache_byte_size is not None:
        log.warning("--response-cache-byte-size is deprecated: use --cache-config local,size=N")
    for name in cache.caches:
        if name != "local":
            log.warning(
                "cache implementation '%s' is not available (only 'local'); ignoring it", name
            )
    metrics_address = args.metrics_address
    if metrics_address is None:
        metrics_address = args.http_address if args.allow_http else "0.0.0.0"
    ignored = [
        "--" + key[len("ignored_") :].replace("_", "-")
        for key, value in vars(args).items()
        if key.startswith("ignored_") and value is not None
    ]
    settings = Settings(
        model_repositories=args.model_repositories,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        http_address=args.http_address,
        grpc_address=args.grpc_address,
        metrics_address=metrics_address,
        metrics_config=metrics_config,
        allow_http=args.allow_http,
        allow_grpc=args.allow_grpc,
        allow_metrics=args.allow_metrics,
        allow_gpu_metrics=args.allow_gpu_metrics,
        allow_cpu_metrics=args.allow_cpu_metrics,
        allow_status_page=args.allow_status_page,
        metrics_interval_ms=args.metrics_interval_ms,
        autocomplete=autocomplete,
        exit_on_error=args.exit_on_error,
        strict_readiness=args.strict_readiness,
        exit_timeout_secs=args.exit_timeout_secs,
        http_max_input_size=args.http_max_input_size,
        http_busy_poll_us=args.http_busy_poll_us,
        frontend_workers=args.frontend_workers,
        model_control_mode=args.model_control_mode,
        load_models=args.load_models,
        repository_poll_secs=args.repository_poll_secs,
        model_load_thread_count=args.model_load_thread_count,
        backend_config=args.backend_config,
        response_cache_size=cache.local_size(),
        server_id=args.server_id,
        rate_limit=args.rate_limit,
        rate_limit_resources=args.rate_limit_resource,
        http_header_forward_pattern=args.http_header_forward_pattern,
        grpc_header_forward_pattern=args.grpc_header_forward_pattern,
        model_namespacing=args.model_namespacing,
        openai_port=args.openai_port,
        chat_template=args.chat_template,
        reuse_grpc_port=args.reuse_grpc_port,
        grpc_keepalive_time=args.grpc_keepalive_time,
        grpc_keepalive_timeout=args.grpc_keepalive_timeout,
        grpc_keepalive_permit_without_calls=args.grpc_keepalive_permit_without_calls,
        grpc_http2_max_pings_without_data=args.grpc_http2_max_pings_without_data,
        grpc_http2_min_recv_ping_interval_without_data=(
            args.grpc_http2_min_recv_ping_interval_without_data
        ),
        grpc_http2_max_ping_strikes=args.grpc_http2_max_ping_strikes,
        grpc_max_connection_age=args.grpc_max_connection_age,
        grpc_max_connection_age_grace=args.grpc_max_connection_age_grace,
        grpc_restricted_protocols=restricted,
        http_restricted_apis=http_restricted,
        grpc_use_ssl=args.grpc_use_ssl,
        grpc_use_ssl_mutual=args.grpc_use_ssl_mutual,
        grpc_server_cert=args.grpc_server_cert,
        grpc_server_key=args.grpc_server_key,
        grpc_root_cert=args.grpc_root_cert,
        trace=trace,
        log=LogSettings(
            verbose=args.log_verbose,
            info=args.log_info,
            warning=args.log_warning,
            error=args.log_error,
            format=args.log_format,
            file=args.log_file,
        ),
    )
    return settings, ignored


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["tune"]:  # `oceanus tune MODEL ...` (docs/tune.md); tritonserver has none
        from oceanus.tune.cli import main as tune

        return tune(args[1:])
    settings, ignored = parse_args(args)
    from oceanus.main import run

    return run(settings, ignored)


if __name__ == "__main__":
    sys.exit(main())
