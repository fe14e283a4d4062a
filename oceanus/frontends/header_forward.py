"""`--http-header-forward-pattern` / `--grpc-header-forward-pattern`: request headers whose name
matches the regular expression (anywhere in the name, case-insensitively, as Triton's RE2
PartialMatch with its `(?i)` prefix) reach the model as string request parameters, after the
request's own parameters. Triton 2.51 forwards them on HTTP infer, gRPC ModelInfer and
ModelStreamInfer, not on generate; names keep the case the client sent (gRPC metadata names are
lower-case on the wire). Compared with Triton in docs/triton-reference-behaviour.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any


class HeaderForward:
    """One frontend's forwarding rule; falsy when no pattern was given."""

    __slots__ = ("_regex",)

    def __init__(self, pattern: str = "") -> None:
        self._regex = re.compile(pattern, re.IGNORECASE) if pattern else None

    def __bool__(self) -> bool:
        return self._regex is not None

    def apply(self, headers: Iterable[tuple[str, Any]], parameters: dict[str, Any]) -> None:
        """Add each matching (name, value) to `parameters` (bytes values as latin-1 text)."""
        regex = self._regex
        if regex is None:
            return
        for name, value in headers:
            if regex.search(name):
                parameters[name] = value.decode("latin-1") if isinstance(value, bytes) else value
