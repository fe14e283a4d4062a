"""Triton's trace extension requests, read the same way for HTTP and gRPC.

`/v2[/models/<m>]/trace/setting` sends JSON (strings, a list for `trace_level`, null to clear);
gRPC TraceSetting sends a map of string lists (an empty list clears). Both become one
`SettingUpdate` for the core's TraceManager; the error texts are Triton 2.51's, recorded from the
reference server (docs/triton-reference-behaviour.md), which differ a little between the two.
"""

from __future__ import annotations

import re
from typing import Any

from oceanus.core.observability.tracing import (
    INT32_MAX,
    LEVEL_OFF,
    LEVEL_TENSORS,
    LEVEL_TIMESTAMPS,
    MIN_COUNT,
    UINT32_MAX,
    SettingUpdate,
    TraceSettingError,
)

FILE_NOT_UPDATABLE = "trace file location can not be updated through network protocol"
ONLY_OFF = "Expect only one trace level 'OFF' is specified"
_LEADING_INT = re.compile(r"\s*([+-]?\d+)")
# name -> (lowest, highest) accepted value
_RANGES = {
    "trace_rate": (0, UINT32_MAX),
    "trace_count": (MIN_COUNT, INT32_MAX),
    "log_frequency": (0, UINT32_MAX),
}
_FIELDS = {"trace_rate": "rate", "trace_count": "count", "log_frequency": "log_frequency"}


def unknown_model(name: str) -> TraceSettingError:
    return TraceSettingError(f"Request for unknown model : {name}")


def _level(names: list[str]) -> int | None:
    """Triton reads the names in order: OFF only alone; unknown names are skipped, and a list
    of nothing but unknown names changes nothing (None)."""
    level: int | None = None
    for name in names:
        if name == "OFF":
            if len(names) != 1:
                raise TraceSettingError(ONLY_OFF)
            level = LEVEL_OFF
        elif name == "TIMESTAMPS":
            level = (level or LEVEL_OFF) | LEVEL_TIMESTAMPS
        elif name == "TENSORS":
            level = (level or LEVEL_OFF) | LEVEL_TENSORS
    return level


def _number(key: str, text: str, grpc: bool) -> int:
    """An integer as std::stoi reads it (leading digits), within the setting's range."""
    match = _LEADING_INT.match(text)
    if match is None:
        raise TraceSettingError(f"Unable to parse '{key}', got: {text}")
    value = int(match.group(1))
    low, high = _RANGES[key]
    if key == "trace_count" and -(2**31) <= value < low:
        space = " " if grpc else ""
        raise TraceSettingError(
            f"Unable to parse '{key}'. Expecting value >= {MIN_COUNT}, got:{space}{text}"
        )
    if not low <= value <= high:
        raise TraceSettingError(
            f"Unable to parse '{key}', value is out of range [ {low}, {high} ], got: {text}"
        )
    return value


def _apply(update: SettingUpdate, key: str, value: int | None) -> None:
    field = _FIELDS[key]
    if value is None:
        setattr(update, "clear_" + field, True)
    else:
        setattr(update, field, value)


def update_from_json(document: dict[str, Any]) -> SettingUpdate:
    """An HTTP trace setting request body (already parsed)."""
    if "trace_file" in document:
        raise TraceSettingError(FILE_NOT_UPDATABLE, "UNSUPPORTED")
    update = SettingUpdate()
    if "trace_level" in document:
        levels = document["trace_level"]
        if levels is None:
            update.clear_level = True
        else:
            if not isinstance(levels, list):
                raise TraceSettingError("attempt to access JSON non-array as array")
            if not all(isinstance(name, str) for name in levels):
                raise TraceSettingError("attempt to access JSON non-string as string")
            level = _level(levels)
            if level is not None:
                update.level = level
    for key in _FIELDS:
        if key in document:
            value = document[key]
            if value is None:
                _apply(update, key, None)
                continue
            if not isinstance(value, str):
                raise TraceSettingError("attempt to access JSON non-string as string")
            _apply(update, key, _number(key, value, grpc=False))
    return update


def update_from_grpc(settings: dict[str, list[str]]) -> SettingUpdate:
    """A gRPC TraceSettingRequest's settings map (values as lists of strings)."""
    if "trace_file" in settings:
        raise TraceSettingError(FILE_NOT_UPDATABLE, "UNSUPPORTED")
    update = SettingUpdate()
    if "trace_level" in settings:
        levels = settings["trace_level"]
        if not levels:
            update.clear_level = True
        else:
            level = _level(levels)
            if level is not None:
                update.level = level
    for key in _FIELDS:
        if key in settings:
            values = settings[key]
            if not values:
                _apply(update, key, None)
            elif len(values) == 1:
                _apply(update, key, _number(key, values[0], grpc=True))
            else:
                raise TraceSettingError(f"expect only 1 value for '{key}'")
    return update
