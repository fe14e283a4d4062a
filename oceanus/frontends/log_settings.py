"""Triton's logging extension, free of any wire format: the HTTP (`/v2/logging`) and gRPC
(`LogSettings`) frontends both read and change the server's live LogSettings through these.

Behaviour follows Triton 2.51 (server src/http_server.cc HandleLogging, src/grpc/grpc_server.cc
LogSettings), with one difference: a request is checked completely before anything changes, so a
request with one bad setting changes nothing (Triton applies the settings before the bad one).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from oceanus.logs import LogSettings, configure

Document = dict[str, Any]


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


class BadLogSetting(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise BadLogSetting(400, "attempt to access JSON non-boolean as boolean")
    return value


def updated_log_settings(settings: LogSettings, request: dict[str, Any]) -> LogSettings:
    """`settings` with the request's changes; raises BadLogSetting (with an HTTP status),
    changing nothing. Values are JSON's types; the gRPC frontend checks its typed values first."""
    changes: dict[str, Any] = {}
    if request.get("log_file") is not None:
        raise BadLogSetting(501, "log file location can not be updated through network protocol")
    for key, field_name in _SWITCHES:
        if request.get(key) is not None:
            changes[field_name] = _bool(request[key])
    verbose = request.get("log_verbose_level")
    if verbose is not None:
        if isinstance(verbose, bool) or not isinstance(verbose, int) or verbose < 0:
            raise BadLogSetting(
                400, "attempt to access JSON non-unsigned-integer as unsigned-integer"
            )
        changes["verbose"] = min(verbose, 2**31 - 1)
    log_format = request.get("log_format")
    if log_format is not None:
        if not isinstance(log_format, str):
            raise BadLogSetting(400, "attempt to access JSON non-string as string")
        if log_format not in ("default", "ISO8601"):
            # Triton answers 503 here, blaming itself for the client's mistake: 400, same words.
            raise BadLogSetting(400, f"invalid argument for --log_format, got: {log_format}")
        changes["format"] = log_format
    return replace(settings, **changes)


def apply_log_settings(settings: LogSettings, new: LogSettings) -> None:
    """Make `new` the live settings: update `settings` in place and reconfigure the loggers."""
    if new != settings:
        for name in ("verbose", "info", "warning", "error", "format", "file"):
            setattr(settings, name, getattr(new, name))
        configure(settings)
