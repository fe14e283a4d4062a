"""tritonserver's trace flags (`--trace-config` and the deprecated `--trace-*`) -> TraceConfig.

Read as Triton's command_line_parser.cc reads them: `--trace-config <setting>=<value>` for the
global settings (level, rate, count, mode), `--trace-config <mode>,<setting>=<value>` for a mode's
own (triton: file, log-frequency; opentelemetry: url, resource, bsp_*); `--trace-config` wins
over the deprecated flags; any level OFF disables tracing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from oceanus.core.observability.tracing import (
    LEVEL_OFF,
    LEVEL_TENSORS,
    LEVEL_TIMESTAMPS,
    MODE_OPENTELEMETRY,
    MODE_TRITON,
    TraceConfig,
)

log = logging.getLogger("oceanus.cli")

# OpenTelemetry batch span processor settings, their environment variables and defaults.
BSP_DEFAULTS = (
    ("bsp_max_queue_size", "OTEL_BSP_MAX_QUEUE_SIZE", "2048"),
    ("bsp_schedule_delay", "OTEL_BSP_SCHEDULE_DELAY", "5000"),
    ("bsp_max_export_batch_size", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "512"),
)
FORMAT = "--trace-config option format is '<trace mode>,<setting>=<value>'. Got {arg}"


def parse_level(text: str) -> int:
    lowered = text.lower()
    if lowered in ("false", "off"):
        return LEVEL_OFF
    if lowered in ("true", "on", "min", "max", "timestamps"):
        return LEVEL_TIMESTAMPS
    if lowered == "tensors":
        return LEVEL_TENSORS
    raise ValueError(f"invalid value for trace level option: {lowered}")


def parse_mode(text: str) -> str:
    lowered = text.lower()
    if lowered in (MODE_TRITON, MODE_OPENTELEMETRY):
        return lowered
    raise ValueError(
        f"invalid value for trace mode option: {lowered}. "
        'Available options are "triton" and "opentelemetry"'
    )


def split_trace_config(arg: str) -> tuple[str, str, str]:
    """`[<mode>,]<setting>=<value>` -> (mode or "", setting, value)."""
    mode, comma, rest = arg.partition(",")
    if not comma:
        mode, rest = "", arg
    elif not mode:
        raise ValueError(
            "No trace mode specified. --trace-config option format is "
            f"<trace mode>,<setting>=<value> or <setting>=<value>. Got {arg}"
        )
    else:
        mode = parse_mode(mode)
    setting, equals, value = rest.partition("=")
    if not equals or not setting or not value:
        raise ValueError(FORMAT.format(arg=arg))
    return mode, setting, value


def _integer(flag: str, text: str, low: int = -(2**31)) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"Bad option: \"{flag}\".\ninvalid integer '{text}'") from None
    if value < low:
        raise ValueError(f'Bad option: "{flag}".\nvalue must be >= {low}, got {value}')
    return value


def trace_config_from_flags(
    trace_config: Sequence[str],
    trace_level: Sequence[str] = (),
    trace_rate: str | None = None,
    trace_count: str | None = None,
    trace_file: str | None = None,
    trace_log_frequency: str | None = None,
) -> TraceConfig:
    """Raises ValueError with Triton's words for a bad flag."""
    config = TraceConfig()
    disabled = False
    for text in trace_level:
        level = parse_level(text)
        disabled |= level == LEVEL_OFF
        config.level |= level
    if trace_rate is not None:
        config.rate = _integer("--trace-rate", trace_rate, 0)
    if trace_count is not None:
        config.count = _integer("--trace-count", trace_count, -1)
    if trace_file is not None:
        config.file = trace_file
    if trace_log_frequency is not None:
        config.log_frequency = _integer("--trace-log-frequency", trace_log_frequency, 0)
    entries = [split_trace_config(arg) for arg in trace_config]
    for mode, setting, value in entries:
        if mode:
            continue
        flag = f"--trace-config {setting}"
        if setting == "rate":
            config.rate = _integer(flag, value, 0)
        elif setting == "level":
            level = parse_level(value)
            disabled |= level == LEVEL_OFF
            config.level |= level
        elif setting == "mode":
            config.mode = parse_mode(value)
        elif setting == "count":
            config.count = _integer(flag, value, -1)
    mine = [(setting, value) for mode, setting, value in entries if mode == config.mode]
    if config.mode == MODE_TRITON:
        for setting, value in mine:
            if setting == "file":
                config.file = value
            elif setting == "log-frequency":
                config.log_frequency = _integer(f"--trace-config triton,{setting}", value, 0)
    else:
        if trace_file is not None or trace_log_frequency is not None:
            log.warning(
                "'--trace-file' and '--trace-log-frequency' are ignored in opentelemetry mode"
            )
        given = {setting for setting, _ in mine}
        for setting, value in mine:
            if setting.startswith("bsp_"):
                _integer(f"--trace-config opentelemetry,{setting}", value, 0)
        for setting, variable, default in BSP_DEFAULTS:
            if setting not in given:
                value = os.environ.get(variable, default)
                _integer(f"OTEL_{setting.upper()}", value, 0)
                mine.append((setting, value))
        config.file = ""
        config.log_frequency = 0
    config.mode_options = mine
    if disabled:
        config.level = LEVEL_OFF
    return config
