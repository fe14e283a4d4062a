"""The in-process server's options: the command line's, as keyword arguments.

`Server(model_repository="models", model_control_mode="explicit", load_model=["simple"])` means
`oceanus --model-repository=models --model-control-mode=explicit --load-model=simple`: each
keyword is a flag (underscores for dashes), a list repeats it, a bool is `true`/`false`. The
command line's own parser reads them, so defaults, checks and error texts are the same.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
from collections.abc import Mapping, Sequence
from typing import Any

from oceanus.cli import build_parser, parse_args
from oceanus.embedded.errors import InvalidArgumentError
from oceanus.settings import Settings


def _flag_values(name: str, value: Any, action: argparse.Action) -> list[str]:
    if isinstance(action, argparse._StoreTrueAction):
        return [name] if value else []
    values = value if isinstance(value, (list, tuple)) else [value]
    out = []
    for item in values:
        if isinstance(item, bool):
            item = "true" if item else "false"
        elif isinstance(item, os.PathLike):
            item = os.fspath(item)
        out.append(f"{name}={item}")
    return out


def command_line(options: Mapping[str, Any]) -> list[str]:
    """The flags that keyword options stand for."""
    actions = build_parser()._option_string_actions
    argv: list[str] = []
    for key, value in options.items():
        if value is None:
            continue
        name = "--" + key.replace("_", "-")
        action = actions.get(name)
        if action is None:
            raise InvalidArgumentError(f"unknown server option '{key}' (no flag {name})")
        argv += _flag_values(name, value, action)
    return argv


def settings_from_command_line(argv: Sequence[str]) -> Settings:
    """Settings from flags, with the command line's error text raised, not printed."""
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            settings, _ignored = parse_args(list(argv))
    except SystemExit:
        message = errors.getvalue().strip() or "invalid server options"
        raise InvalidArgumentError(message.replace(" (see 'oceanus --help')", "")) from None
    return settings


def settings_from_options(options: Mapping[str, Any]) -> Settings:
    return settings_from_command_line(command_line(options))
