"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with OpenAI's
status codes (400 for a bad request, 404 for an unknown model, 500/503 for the server's own)."""

from __future__ import annotations

import logging

import orjson

from oceanus.core.errors import InferenceServerError
from oceanus.frontends.http.errors import http_status
from oceanus.frontends.http.protocol import HttpResponse
from oceanus.frontends.http.responses import HttpError

log = logging.getLogger("oceanus.openai")

JSON = b"application/json"
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error"}
_TYPES |= {404: "invalid_request_error", 405: "invalid_request_error", 413: "invalid_request_error"}


class OpenAIError(Exception):
    """A failure answered to the client: status, message, and OpenAI's `param` / `code`."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def document(self) -> dict[str, object]:
        kind = _TYPES.get(
            self.status, "server_error" if self.status >= 500 else "invalid_request_error"
        )
        return {
            "error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        }

    def response(self) -> HttpResponse:
        return HttpResponse(self.status, orjson.dumps(self.document()), [(b"content-type", JSON)])


def bad_request(message: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param)


def model_not_found(name: str) -> OpenAIError:
    return OpenAIError(404, f"The model '{name}' does not exist", "model", "model_not_found")


def as_openai_error(exc: BaseException) -> OpenAIError:
    """Any failure as the error the client reads (a core error keeps its words and status,
    except that the server's own 501 for a model that cannot do this is the client's 400)."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, HttpError):
        return OpenAIError(exc.status, exc.message)
    if isinstance(exc, InferenceServerError):
        status = http_status(exc.code)
        return OpenAIError(400 if status == 501 else status, exc.message)
    log.error("unexpected error: %s", exc, exc_info=exc)
    return OpenAIError(500, f"internal error: {type(exc).__name__}: {exc}")
