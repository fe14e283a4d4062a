"""The in-process API's errors: one class per Triton error code, as the `tritonserver` package
names them, each still an `InferenceServerError` (the core's one error type)."""

from __future__ import annotations

from oceanus.core.errors import ErrorCode, InferenceServerError


class TritonError(InferenceServerError):
    """Base of every error the in-process API raises (Triton's name)."""

    CODE = ErrorCode.UNKNOWN

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(self.CODE, message, hint)


class UnknownError(TritonError):
    CODE = ErrorCode.UNKNOWN


class InternalError(TritonError):
    CODE = ErrorCode.INTERNAL


class NotFoundError(TritonError):
    CODE = ErrorCode.NOT_FOUND


class InvalidArgumentError(TritonError):
    CODE = ErrorCode.INVALID_ARG


class UnavailableError(TritonError):
    CODE = ErrorCode.UNAVAILABLE


class UnsupportedError(TritonError):
    CODE = ErrorCode.UNSUPPORTED


class AlreadyExistsError(TritonError):
    CODE = ErrorCode.ALREADY_EXISTS


class CancelledError(TritonError):
    CODE = ErrorCode.CANCELLED


_BY_CODE: dict[ErrorCode, type[TritonError]] = {
    cls.CODE: cls
    for cls in (
        UnknownError,
        InternalError,
        NotFoundError,
        InvalidArgumentError,
        UnavailableError,
        UnsupportedError,
        AlreadyExistsError,
        CancelledError,
    )
}


def translate(error: BaseException) -> TritonError:
    """The API's error for one the core (or anything under it) raised."""
    if isinstance(error, TritonError):
        return error
    if isinstance(error, InferenceServerError):
        return _BY_CODE[error.code](error.message, error.hint)
    return InternalError(f"{type(error).__name__}: {error}")
