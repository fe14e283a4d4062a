"""The run's clock and its progress lines."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from oceanus.tune.measure import Measurement


class Clock:
    """The time budget of the whole run (`--max-minutes`)."""

    def __init__(self, seconds: float) -> None:
        self.total = seconds
        self.start = time.monotonic()
        self.deadline = self.start + seconds

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return self.deadline - time.monotonic()


class Progress:
    """One line per step on stderr, prefixed with the elapsed time."""

    def __init__(self, clock: Clock, stream: TextIO | None = None) -> None:
        self.clock = clock
        self.stream = stream

    def __call__(self, text: str) -> None:
        stream = self.stream or sys.stderr
        print(f"[{self.clock.elapsed():5.0f}s] {text}", file=stream, flush=True)


def describe(point: Measurement) -> str:
    """A measurement as one progress line."""
    if point.error:
        return f"c={point.concurrency:<4} failed: {point.error}"
    batch = f"   batch {point.avg_batch:4.2f}" if point.avg_batch is not None else ""
    errors = f"   {point.errors} errors" if point.errors else ""
    return (
        f"c={point.concurrency:<4} {point.throughput:10,.0f} infer/s   p50 {point.p50_ms:7.2f} ms"
        f"   p99 {point.p99_ms:7.2f} ms{batch}{errors}"
    )
