"""HTTP request helpers of Triton's extensions: the logging extension (`GET/POST /v2/logging`)
and the model repository extension's load parameters.

Plain functions, free of routing: the HTTP app calls them with the request's method and body and
sends back the (status, JSON document) they return. The settings logic is shared with gRPC in
oceanus/frontends/log_settings.py.
"""

from __future__ import annotations

import base64
from typing import Any

import orjson

from oceanus.core.errors import invalid_arg
from oceanus.frontends.log_settings import (
    BadLogSetting,
    Document,
    apply_log_settings,
    log_settings_document,
    updated_log_settings,
)
from oceanus.logs import LogSettings

METHOD_NOT_ALLOWED: tuple[int, Document] = (405, {"error": "Method Not Allowed"})


def handle_logging(settings: LogSettings, method: str, body: bytes) -> tuple[int, Document]:
    """`GET /v2/logging` (current settings) or `POST /v2/logging` (change, then current).

    `settings` is the server's live LogSettings (Settings.log): a successful POST updates it in
    place and re-applies it with `logs.configure`, so later GETs and the process's loggers agree.
    Returns (HTTP status, JSON document); errors are `{"error": message}`.
    """
    if method not in ("GET", "POST"):
        return METHOD_NOT_ALLOWED
    if method == "POST" and body.strip():
        try:
            request = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            return 400, {"error": f"failed to parse the request JSON buffer: {exc}"}
        if not isinstance(request, dict):
            return 400, {"error": "dynamic logging request must be a JSON object"}
        try:
            new = updated_log_settings(settings, request)
        except BadLogSetting as exc:
            return exc.status, {"error": exc.message}
        apply_log_settings(settings, new)
    return 200, log_settings_document(settings)


def decode_files(name: str, parameters: dict[str, Any]) -> dict[str, bytes]:
    """A repository load's `file:<version>/<name>` parameters (base64 over HTTP; gRPC sends
    bytes) -> relative path -> bytes."""
    files: dict[str, bytes] = {}
    for key, value in parameters.items():
        if not key.startswith("file:"):
            continue
        try:
            files[key[len("file:") :]] = base64.b64decode(value, validate=True)
        except (ValueError, TypeError):
            raise invalid_arg(
                f"failed to load '{name}': parameter '{key}' is not valid base64"
            ) from None
    return files
