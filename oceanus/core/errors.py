"""One error type for the whole core, carrying Triton's error codes.

Frontends map the code once to their own status (HTTP status, gRPC status code); the message
text is the same on every protocol.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.Enum):
    """Triton's TRITONSERVER_Error_Code values."""

    UNKNOWN = "unknown"
    INTERNAL = "internal"
    NOT_FOUND = "not_found"
    INVALID_ARG = "invalid_arg"
    UNAVAILABLE = "unavailable"
    UNSUPPORTED = "unsupported"
    ALREADY_EXISTS = "already_exists"
    CANCELLED = "cancelled"


class InferenceServerError(Exception):
    """An error with a Triton error code; its message is shown to the client verbatim.

    `hint` is advice for the person reading the server's log (what to change in the
    repository); it is logged beside the message and never sent to a client, so the wire
    keeps Triton's words."""

    def __init__(self, code: ErrorCode, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.hint = hint

    def __repr__(self) -> str:
        return f"InferenceServerError({self.code.name}, {self.message!r})"


def invalid_arg(message: str, hint: str = "") -> InferenceServerError:
    return InferenceServerError(ErrorCode.INVALID_ARG, message, hint)


def not_found(message: str) -> InferenceServerError:
    return InferenceServerError(ErrorCode.NOT_FOUND, message)


def unavailable(message: str) -> InferenceServerError:
    return InferenceServerError(ErrorCode.UNAVAILABLE, message)


def internal(message: str) -> InferenceServerError:
    return InferenceServerError(ErrorCode.INTERNAL, message)


def unsupported(message: str) -> InferenceServerError:
    return InferenceServerError(ErrorCode.UNSUPPORTED, message)
