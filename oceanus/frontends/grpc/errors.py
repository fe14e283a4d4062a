"""Core error codes -> gRPC status codes, mapped once for the gRPC frontend as Triton maps them."""

from __future__ import annotations

import logging

import grpc

from oceanus.core.errors import ErrorCode, InferenceServerError

log = logging.getLogger("oceanus.grpc")

GRPC_STATUS: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.UNKNOWN: grpc.StatusCode.UNKNOWN,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
    ErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.INVALID_ARG: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorCode.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorCode.CANCELLED: grpc.StatusCode.CANCELLED,
}


def grpc_status(code: ErrorCode) -> grpc.StatusCode:
    return GRPC_STATUS.get(code, grpc.StatusCode.UNKNOWN)


def failure_status(exc: Exception, what: str) -> tuple[grpc.StatusCode, str]:
    """The gRPC status for an exception raised while serving an RPC."""
    if isinstance(exc, InferenceServerError):
        return grpc_status(exc.code), exc.message
    log.exception("unexpected error serving %s", what)
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"
