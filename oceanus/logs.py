"""Triton-style logging: `I1202 18:07:04.123456 4242 file.py:88] message` (or ISO8601)."""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass

_LEVEL_LETTER = {logging.DEBUG: "I", logging.INFO: "I", logging.WARNING: "W", logging.ERROR: "E"}
# Python level for Triton's verbose levels: --log-verbose N maps to DEBUG.
VERBOSE = logging.DEBUG


class TritonFormatter(logging.Formatter):
    def __init__(self, iso8601: bool = False) -> None:
        super().__init__()
        self.iso8601 = iso8601
        self._pid = os.getpid()

    def format(self, record: logging.LogRecord) -> str:
        letter = _LEVEL_LETTER.get(record.levelno, "E" if record.levelno > logging.ERROR else "I")
        where = f"{os.path.basename(record.pathname)}:{record.lineno}"
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        if self.iso8601:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
            return f"{stamp} {letter} {self._pid} {where}] {message}"
        local = time.localtime(record.created)
        micros = int((record.created % 1) * 1_000_000)
        stamp = time.strftime("%m%d %H:%M:%S", local)
        return f"{letter}{stamp}.{micros:06d} {self._pid} {where}] {message}"


@dataclass
class LogSettings:
    verbose: int = 0
    info: bool = True
    warning: bool = True
    error: bool = True
    format: str = "default"
    file: str = ""


def configure(settings: LogSettings) -> None:
    """Apply log settings to the `oceanus` logger tree (callable again at run time)."""
    root = logging.getLogger("oceanus")
    if settings.verbose > 0:
        level = VERBOSE
    elif settings.info:
        level = logging.INFO
    elif settings.warning:
        level = logging.WARNING
    elif settings.error:
        level = logging.ERROR
    else:
        level = logging.CRITICAL + 1
    root.setLevel(level)
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    handler: logging.Handler
    handler = (
        logging.FileHandler(settings.file) if settings.file else logging.StreamHandler(sys.stderr)
    )
    handler.setFormatter(TritonFormatter(iso8601=settings.format.upper() == "ISO8601"))
    root.addHandler(handler)
    root.propagate = False


def table(headers: list[str], rows: list[list[str]], max_width: int | None = None) -> str:
    """An ASCII table like the ones Triton prints at start-up. With `max_width`, cells are put
    on one line and the widest columns are cut ("...") until every line fits."""
    if max_width is not None:
        rows = [[" ".join(cell.split()) for cell in row] for row in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    if max_width is not None:
        # Each column costs its width plus 3 ("| " and " "), and the closing "|" one more.
        while sum(widths) + 3 * len(widths) + 1 > max_width:
            widest = max(range(len(widths)), key=lambda i: widths[i])
            if widths[widest] <= max(len(headers[widest]), 8):
                break  # nothing left worth cutting
            widths[widest] -= 1
        rows = [
            [_cut(cell, width) for cell, width in zip(row, widths, strict=True)] for row in rows
        ]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def row(cells: list[str]) -> str:
        return "|" + "|".join(f" {c.ljust(w)} " for c, w in zip(cells, widths, strict=True)) + "|"

    return "\n".join([line, row(headers), line, *(row(r) for r in rows), line])


def _cut(cell: str, width: int) -> str:
    return cell if len(cell) <= width else cell[: width - 3] + "..."
