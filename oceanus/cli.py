"""`oceanus` command line: tritonserver's flags, names, defaults and meanings.

A Triton launch line works after swapping the binary. Flags of features Oceanus does not have
are accepted with a warning rather than refused, so such launch lines still start.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from oceanus import __version__
from oceanus.declaration import GROUPS, Setting, declared, default_of
from oceanus.settings import IGNORED_FLAGS, Settings

log = logging.getLogger("oceanus.cli")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One clear line and exit code 2, not argparse's usage block."""
        self.exit(2, f"oceanus: error: {message} (see 'oceanus --help')\n")


def _help(declared_setting: Setting, default: Any) -> str:
    """The declared help with its unit and default (argparse %-formats help: % doubled)."""
    text = declared_setting.help
    if declared_setting.unit:
        text += f" [{declared_setting.unit}]"
    if isinstance(default, bool):
        default = str(default).lower() if not declared_setting.bare else None
    if default not in (None, "", [], {}) and "default" not in text:
        text += f" (default: {default})"
    return text.replace("%", "%%")


def add_settings(
    parser: argparse.ArgumentParser, settings_class: type, groups: Sequence[str]
) -> None:
    """A flag for each declared field of `settings_class` (oceanus/declaration.py), in its
    `--help` group."""
    sections = {name: parser.add_argument_group(name) for name in groups}
    for item, declared_setting in declared(settings_class):
        default = default_of(item)
        options: dict[str, Any] = {"dest": item.name, "help": _help(declared_setting, default)}
        if declared_setting.bare:
            options["action"] = "store_true"
        else:
            options["type"] = declared_setting.text
            # Triton's --help spells a value's kind so (`--http-port <integer>`).
            kind = "<integer>" if declared_setting.kind is int else "<string>"
            options["metavar"] = declared_setting.metavar or kind
            options["default"] = default
            if declared_setting.many:
                options.update(nargs="+", action="extend", default=[])
            elif declared_setting.repeat:
                options["action"] = "append"
                options["default"] = []
            elif declared_setting.switch:
                options.update(nargs="?", const=True)
        sections[declared_setting.group].add_argument(*declared_setting.flags, **options)


def build_parser() -> argparse.ArgumentParser:
    """tritonserver's flags, generated from the declared settings (oceanus/settings.py)."""
    parser = _Parser(
        prog="oceanus",
        description="Oceanus: an inference server that speaks NVIDIA Triton's protocols. "
        "Takes tritonserver's flags. `oceanus serve MODEL` serves one language model as "
        "`vllm serve` does (docs/vllm-compat.md).",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"oceanus {__version__}")
    add_settings(parser, Settings, GROUPS)
    for name in IGNORED_FLAGS:
        dest = "ignored_" + name[2:].replace("-", "_")
        parser.add_argument(name, dest=dest, action="append", help=argparse.SUPPRESS)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> tuple[Settings, list[str]]:
    """Settings from the command line, plus the ignored flags that were given."""
    parser = build_parser()
    args = vars(parser.parse_args(argv))
    values = {}
    for item, declared_setting in declared(Settings):
        value = args[item.name]
        if declared_setting.repeat and declared_setting.combine is not None:
            try:
                value = declared_setting.combine(value)
            except ValueError as exc:
                parser.error(str(exc))
        values[item.name] = value
    try:
        settings = Settings(**values)
    except ValueError as exc:
        parser.error(str(exc))
    for warning in settings.warnings():
        log.warning("%s", warning)
    ignored = [
        "--" + key[len("ignored_") :].replace("_", "-")
        for key, value in args.items()
        if key.startswith("ignored_") and value is not None
    ]
    return settings, ignored


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["tune"]:  # `oceanus tune MODEL ...` (docs/tune.md); tritonserver has none
        from oceanus.tune.cli import main as tune

        return tune(args[1:])
    if args[:1] == ["serve"]:  # `oceanus serve MODEL ...`: vLLM's command line (serve.py)
        from oceanus.serve import main as serve

        return serve(args[1:])
    settings, ignored = parse_args(args)
    from oceanus.main import run

    return run(settings, ignored)


if __name__ == "__main__":
    sys.exit(main())
