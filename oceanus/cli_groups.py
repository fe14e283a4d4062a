"""Flag groups of the command line (scheduling and rate limiting, gRPC, tracing), each added to
the parser by cli.build_parser; cli.py keeps the parser, the rest of the flags and their reading."""

from __future__ import annotations

import argparse
import logging
import re

from oceanus.core.scheduling.rate_limiter import ResourceLimit, parse_mode, parse_resource
from oceanus.frontends.grpc import keepalive

log = logging.getLogger("oceanus.cli")

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean value '{text}'")


def parse_nonnegative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer '{text}'") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"value must be non-negative, got {value}")
    return value


def flag(parser: argparse.ArgumentParser, name: str, default: bool, help_text: str) -> None:
    parser.add_argument(
        name,
        type=parse_bool,
        nargs="?",
        const=True,
        default=default,
        metavar="BOOL",
        help=help_text,
    )


def scheduling_options(parser: argparse.ArgumentParser) -> None:
    """Rate limiter, header forwarding and model namespacing (Triton's flags)."""
    add = parser.add_argument
    add("--rate-limit", type=_rate_limit_mode, default="off", metavar="execution_count|off")
    add(
        "--rate-limit-resource",
        type=_rate_limit_resource,
        action="append",
        default=[],
        metavar="<name>:<count>[:<device>]",
    )
    add("--http-header-forward-pattern", type=_regex, default="", metavar="REGEX")
    add("--grpc-header-forward-pattern", type=_regex, default="", metavar="REGEX")
    add("--model-namespacing", type=parse_bool, default=False, metavar="BOOL")


def _rate_limit_mode(text: str) -> str:
    try:
        return parse_mode(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _rate_limit_resource(text: str) -> ResourceLimit:
    try:
        return parse_resource(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _regex(text: str) -> str:
    try:
        re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"invalid regular expression '{text}': {exc}") from None
    return text


def grpc_options(parser: argparse.ArgumentParser) -> None:
    """Triton's gRPC frontend flags (times in milliseconds)."""
    add = parser.add_argument
    flag(parser, "--reuse-grpc-port", False, "let several servers listen on the gRPC port")
    add(
        "--grpc-keepalive-time",
        type=parse_nonnegative,
        default=keepalive.KEEPALIVE_TIME_MS,
        metavar="MS",
    )
    add(
        "--grpc-keepalive-timeout",
        type=parse_nonnegative,
        default=keepalive.KEEPALIVE_TIMEOUT_MS,
        metavar="MS",
    )
    flag(
        parser,
        "--grpc-keepalive-permit-without-calls",
        False,
        "allow keepalive pings without calls in flight",
    )
    add(
        "--grpc-http2-max-pings-without-data",
        type=parse_nonnegative,
        default=keepalive.HTTP2_MAX_PINGS_WITHOUT_DATA,
    )
    add(
        "--grpc-http2-min-recv-ping-interval-without-data",
        type=parse_nonnegative,
        default=keepalive.HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
        metavar="MS",
    )
    add(
        "--grpc-http2-max-ping-strikes",
        type=parse_nonnegative,
        default=keepalive.HTTP2_MAX_PING_STRIKES,
    )
    add("--grpc-max-connection-age", type=parse_nonnegative, default=None, metavar="MS")
    add("--grpc-max-connection-age-grace", type=parse_nonnegative, default=None, metavar="MS")
    add(
        "--grpc-restricted-protocol",
        action="append",
        default=[],
        metavar="<protocols>:<key>=<value>",
        help="RPC groups (health, metadata, inference, shared-memory, model-config, "
        "model-repository, statistics, trace, logging) that need the metadata "
        "'triton-grpc-protocol-<key>: <value>'",
    )
    flag(parser, "--grpc-use-ssl", False, "serve gRPC over TLS")
    flag(parser, "--grpc-use-ssl-mutual", False, "serve gRPC over mutual TLS")
    add("--grpc-server-cert", default="", metavar="PEM")
    add("--grpc-server-key", default="", metavar="PEM")
    add("--grpc-root-cert", default="", metavar="PEM")


def trace_options(parser: argparse.ArgumentParser) -> None:
    """Triton's trace flags (read by oceanus/trace_flags.py)."""
    add = parser.add_argument
    add(
        "--trace-config",
        action="append",
        default=[],
        metavar="[<mode>,]<setting>=<value>",
        help="trace settings: level=TIMESTAMPS|TENSORS|OFF, rate=N, count=N, "
        "mode=triton|opentelemetry, triton,file=PATH, triton,log-frequency=N, "
        "opentelemetry,url=URL, opentelemetry,resource=K=V (repeatable)",
    )
    add("--trace-level", action="append", default=[], help="deprecated: --trace-config level=")
    add("--trace-rate", default=None, help="deprecated: --trace-config rate=")
    add("--trace-count", default=None, help="deprecated: --trace-config count=")
    add("--trace-file", default=None, help="deprecated: --trace-config triton,file=")
    add(
        "--trace-log-frequency",
        default=None,
        help="deprecated: --trace-config triton,log-frequency=",
    )
