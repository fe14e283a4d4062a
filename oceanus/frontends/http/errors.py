"""Core error codes -> HTTP status, mapped once for the HTTP frontend (as Triton maps them)."""

from __future__ import annotations

from oceanus.core.errors import ErrorCode

HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.UNKNOWN: 500,
    ErrorCode.INTERNAL: 500,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.INVALID_ARG: 400,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.UNSUPPORTED: 501,
    ErrorCode.ALREADY_EXISTS: 400,  # Triton's (a region already registered)
    ErrorCode.CANCELLED: 499,
}


def http_status(code: ErrorCode) -> int:
    return HTTP_STATUS.get(code, 500)
