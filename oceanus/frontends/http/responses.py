"""HTTP responses in Triton's forms: JSON documents, and errors as `{"error": <message>}` with
the status each error's code maps to (errors.py)."""

from __future__ import annotations

import logging
from typing import Any

import orjson

from oceanus.core.errors import InferenceServerError
from oceanus.frontends.http.errors import http_status
from oceanus.frontends.http.protocol import Headers, HttpResponse

log = logging.getLogger("oceanus.http")

JSON = b"application/json"


class HttpError(Exception):
    """An HTTP-only failure (routing, method, encoding) with its status."""

    def __init__(self, status: int, message: str, headers: Headers | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or []


def json_response(document: Any, status: int = 200, headers: Headers | None = None) -> HttpResponse:
    return HttpResponse(status, orjson.dumps(document), [(b"content-type", JSON), *(headers or [])])


def error_response(status: int, message: str, headers: Headers | None = None) -> HttpResponse:
    return json_response({"error": message}, status, headers)


def error_of(exc: BaseException) -> HttpResponse:
    """The answer to a failure: its status and words (a bug: 500, logged)."""
    if isinstance(exc, HttpError):
        return error_response(exc.status, exc.message, exc.headers)
    if isinstance(exc, InferenceServerError):
        return error_response(http_status(exc.code), exc.message)
    log.error("unexpected error: %s", exc, exc_info=exc)
    return error_response(500, f"internal error: {type(exc).__name__}: {exc}")
