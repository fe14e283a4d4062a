"""The in-process server's options: the command line's settings, as keyword arguments.

`Server(model_repository="models", model_control_mode="explicit", load_model=["simple"])` means
`oceanus --model-repository=models --model-control-mode=explicit --load-model=simple`: each
keyword is a flag's name (underscores for dashes; oceanus/settings.py declares them all), a
list repeats it, text is read as the flag reads it and other values must be of its type. They
are checked straight into the same `Settings`, with the flag's name in every error.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from oceanus.declaration import Setting, declared
from oceanus.embedded.errors import InvalidArgumentError
from oceanus.settings import IGNORED_FLAGS, Settings

log = logging.getLogger("oceanus.embedded")


def keywords() -> dict[str, tuple[str, Setting]]:
    """Every keyword (each flag name and alias) -> (its Settings field, its declaration)."""
    table: dict[str, tuple[str, Setting]] = {}
    for item, declared_setting in declared(Settings):
        for flag in declared_setting.flags:
            table[flag[2:].replace("-", "_")] = (item.name, declared_setting)
    return table


IGNORED_KEYWORDS = {flag[2:].replace("-", "_"): flag for flag in IGNORED_FLAGS}


def settings_from_options(options: Mapping[str, Any]) -> Settings:
    """Settings from keyword options; InvalidArgumentError names the flag of a bad one."""
    table = keywords()
    values: dict[str, Any] = {}
    for key, given in options.items():
        if given is None:  # the flag left out: its default
            continue
        if key in IGNORED_KEYWORDS:
            log.warning("option %s is accepted for compatibility but not implemented", key)
            continue
        if key not in table:
            close = difflib.get_close_matches(key, list(table), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise InvalidArgumentError(f"unknown server option '{key}'{hint}")
        name, declared_setting = table[key]
        if name in values:
            raise InvalidArgumentError(f"server option '{key}' given twice (as an alias)")
        try:
            values[name] = declared_setting.value(given)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            flag = declared_setting.flags[0]
            raise InvalidArgumentError(f"server option '{key}' ({flag}): {exc}") from None
    try:
        settings = Settings(**values)
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from None
    for warning in settings.warnings():
        log.warning("%s", warning)
    return settings


def settings_from_command_line(argv: Sequence[str]) -> Settings:
    """Settings from flags, with the command line's error text raised, not printed."""
    from oceanus.cli import parse_args

    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            settings, _ignored = parse_args(list(argv))
    except SystemExit:
        message = errors.getvalue().strip() or "invalid server options"
        raise InvalidArgumentError(message.replace(" (see 'oceanus --help')", "")) from None
    return settings
