"""The time the schedulers read and the timers they arm, behind one small interface.

The dynamic batcher (max_queue_delay, queue timeouts), the sequence batcher (idle timeouts) and
the statistics all measure time. They read it from a `Clock` the server core hands them, so that
tests can drive time by hand (tests/core/fakes.py `ManualClock`) instead of sleeping. The real
clock is `time.monotonic_ns` itself and the event loop's timers: reading it costs what calling
`time.monotonic_ns()` costs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol


class Timer(Protocol):
    """An armed timer (asyncio.TimerHandle is one)."""

    def cancel(self) -> None: ...


class Clock(Protocol):
    """Monotonic nanoseconds and timers at such times. Read from any thread; timers are armed
    and fire on the event loop."""

    def now_ns(self) -> int: ...

    def call_at(self, when_ns: int, callback: Callable[[], object]) -> Timer:
        """Run `callback` on the event loop once `now_ns()` reaches `when_ns`."""
        ...


class MonotonicClock:
    """The real clock: `time.monotonic_ns` and the running loop's timers (asyncio's and
    uvloop's loop time is the same monotonic clock, in seconds)."""

    __slots__ = ("now_ns",)

    def __init__(self) -> None:
        # The C function itself, not a method wrapping it: `clock.now_ns()` on the hot path
        # costs one attribute lookup more than `time.monotonic_ns()`.
        self.now_ns: Callable[[], int] = time.monotonic_ns

    def call_at(self, when_ns: int, callback: Callable[[], object]) -> Timer:
        return asyncio.get_running_loop().call_at(when_ns / 1e9, callback)


# The clock of every core not handed another one.
MONOTONIC = MonotonicClock()
