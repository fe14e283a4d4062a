"""How one setting is declared (oceanus/settings.py declares them all): its Triton flag names,
type, unit, default, help and `--help` group, in one place. The command line's parser
(cli.py) and the in-process keywords (`oceanus.Server(...)`, embedded/options.py) are read
from these declarations, so a flag and its keyword cannot drift apart.

No grpc or numpy import here: the command line stays cheap to parse.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# --help's groups, in order.
GROUPS = (
    "models",
    "HTTP",
    "gRPC",
    "metrics",
    "logging",
    "tracing",
    "scheduling and caching",
    "Oceanus's own (not tritonserver's)",
)

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean value '{text}'")


def parse_nonnegative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer '{text}'") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"value must be non-negative, got {value}")
    return value


def parse_port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port '{text}'") from None
    if not -1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is out of range")
    return value


def parse_workers(text: str) -> int | None:
    """`--frontend-workers`: a count, or `auto` (None)."""
    if text.strip().lower() == "auto":
        return None
    try:
        count = int(text)
    except ValueError:
        count = -1
    if count < 0:
        raise argparse.ArgumentTypeError(f"expected a number of workers or 'auto', got '{text}'")
    return count


def parse_regex(text: str) -> str:
    try:
        re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"invalid regular expression '{text}': {exc}") from None
    return text


def checked(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """A parser raising ValueError, as argparse's type (which would hide its message)."""

    def parse_text(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse_text


def choice(*choices: str, lower: bool = False) -> Callable[[str], str]:
    """One of `choices` (`lower`: read case-insensitively, as Triton reads
    --model-control-mode=POLL)."""

    def parse(text: str) -> str:
        value = text.lower() if lower else text
        if value not in choices:
            listed = ", ".join(f"'{c}'" for c in choices)
            raise argparse.ArgumentTypeError(f"invalid choice: '{text}' (choose from {listed})")
        return value

    return parse


@dataclass(frozen=True)
class Setting:
    """One setting: `flags[0]` is Triton's name (the others its aliases); the keyword of
    `oceanus.Server(...)` is that name with underscores."""

    flags: tuple[str, ...]
    help: str
    group: str
    # One value's Python type; a keyword that is not text must be one of these.
    kind: type
    # Text to one value (argparse's `type`); raises ArgumentTypeError. None: the text itself.
    parse: Callable[[str], Any] | None = None
    unit: str = ""
    metavar: str | None = None
    # Repeatable flag: the values in order, or `combine(values)` (raises ValueError).
    repeat: bool = False
    combine: Callable[[list[Any]], Any] | None = None
    # `--flag` alone means true (Triton's boolean flags also take =true/=false).
    switch: bool = False
    # The flag takes no value at all (`--disable-auto-complete-config`).
    bare: bool = False
    # One flag takes several values (`--served-model-name a b`, vLLM's nargs="+"); a list.
    many: bool = False

    @property
    def keyword(self) -> str:
        return self.flags[0][2:].replace("-", "_")

    def text(self, text: str) -> Any:
        return self.parse(text) if self.parse is not None else text

    def value(self, given: Any) -> Any:
        """A keyword's value as the settings hold it (raises ArgumentTypeError/ValueError)."""
        if self.repeat:
            if self.combine is not None and isinstance(given, dict):
                return dict(given)  # already combined (restrictions, metrics pairs)
            items = list(given) if isinstance(given, (list, tuple)) else [given]
            values = [self._one(item) for item in items]
            return self.combine(values) if self.combine is not None else values
        return None if given is None else self._one(given)

    def _one(self, given: Any) -> Any:
        if isinstance(given, os.PathLike):
            given = os.fspath(given)
        if isinstance(given, str):
            return self.text(given)
        # bool is an int to Python, not to a flag: `http_port=True` is a mistake.
        if not isinstance(given, self.kind) or (isinstance(given, bool) and self.kind is not bool):
            raise argparse.ArgumentTypeError(
                f"expected {self.kind.__name__}, got {type(given).__name__} {given!r}"
            )
        if self.kind in (int, bool):
            return self.text(str(given))  # the flag's own range checks
        return given


# The usual kinds of flag, as `setting(..., **BOOL)`.
BOOL: dict[str, Any] = {"parse": parse_bool, "metavar": "BOOL", "switch": True}
COUNT: dict[str, Any] = {"parse": parse_nonnegative, "kind": int}
PORT: dict[str, Any] = {"parse": parse_port, "kind": int, "metavar": "PORT"}
MS: dict[str, Any] = {"parse": parse_nonnegative, "kind": int, "unit": "ms", "metavar": "MS"}


def setting(
    default: Any,
    flags: str | Sequence[str],
    help: str,
    group: str,
    kind: type | None = None,
    **options: Any,
) -> Any:
    """A `Settings` field declared with its flag (`dataclasses.field` with the metadata)."""
    names = (flags,) if isinstance(flags, str) else tuple(flags)
    if kind is None:  # a list, dict or None default holds text unless told
        kind = str if default is None or isinstance(default, (list, dict)) else type(default)
    declared = Setting(names, help, group, kind, **options)
    if isinstance(default, (list, dict)):
        return dataclasses.field(
            default_factory=lambda: type(default)(default), metadata={"setting": declared}
        )
    return dataclasses.field(default=default, metadata={"setting": declared})


def declared(settings_class: type) -> list[tuple[dataclasses.Field[Any], Setting]]:
    """The declared fields of a settings dataclass, in order (derived fields left out)."""
    return [
        (item, item.metadata["setting"])
        for item in dataclasses.fields(settings_class)
        if "setting" in item.metadata
    ]


def default_of(item: dataclasses.Field[Any]) -> Any:
    if item.default_factory is not dataclasses.MISSING:
        return item.default_factory()
    return item.default
