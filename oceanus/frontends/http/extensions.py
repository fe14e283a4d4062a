"""HTTP handlers of Triton's logging extension (`GET/POST /v2/logging`).

Plain functions, free of routing: the HTTP app calls them with the request's method and body and
sends back the (status, JSON document) they return. Behaviour follows Triton 2.51
(server src/http_server.cc HandleLogging), with one difference: a POST is checked completely
before anything changes, so a request with one bad setting changes nothing (Triton applies the
settings before the bad one).

The trace extension (`/v2/trace/setting`) is not implemented: Oceanus writes no traces.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson

from oceanus.logs import LogSettings, configure

Document = dict[str, Any]

METHOD_NOT_ALLOWED: tuple[int, Document] = (405, {"error": "Method Not Allowed"})


def log_settings_document(settings: LogSettings) -> Document:
    """Triton's log setting response, keys in Triton's order."""
    return {
        "log_file": settings.file,
        "log_info": settings.info,
        "log_warning": settings.warning,
        "log_error": settings.error,
        "log_verbose_level": settings.verbose,
        "log_format": "ISO8601" if settings.format.upper() == "ISO8601" else "default",
    }


_SWITCHES = (("log_info", "info"), ("log_warning", "warning"), ("log_error", "error"))


class _BadSetting(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _BadSetting(400, "attempt to access JSON non-boolean as boolean")
    return value


def _updated(settings: LogSettings, request: dict[str, Any]) -> LogSettings:
    """`settings` with the request's changes; raises _BadSetting, changing nothing."""
    changes: dict[str, Any] = {}
    if request.get("log_file") is not None:
        raise _BadSetting(501, "log file location can not be updated through network protocol")
    for key, field_name in _SWITCHES:
        if request.get(key) is not None:
            changes[field_name] = _bool(request[key])
    verbose = request.get("log_verbose_level")
    if verbose is not None:
        if isinstance(verbose, bool) or not isinstance(verbose, int) or verbose < 0:
            raise _BadSetting(
                400, "attempt to access JSON non-unsigned-integer as unsigned-integer"
            )
        changes["verbose"] = min(verbose, 2**31 - 1)
    log_format = request.get("log_format")
    if log_format is not None:
        if not isinstance(log_format, str):
            raise _BadSetting(400, "attempt to access JSON non-string as string")
        if log_format not in ("default", "ISO8601"):
            # Triton answers UNAVAILABLE (503) here, with this text.
            raise _BadSetting(503, f"invalid argument for --log_format, got: {log_format}")
        changes["format"] = log_format
    return replace(settings, **changes)


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
            new = _updated(settings, request)
        except _BadSetting as exc:
            return exc.status, {"error": exc.message}
        if new != settings:
            for name in ("verbose", "info", "warning", "error", "format", "file"):
                setattr(settings, name, getattr(new, name))
            configure(settings)
    return 200, log_settings_document(settings)
