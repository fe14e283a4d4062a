"""Busy polling: after a response, keep the event loop polling for a short while instead of
letting it sleep, when the next request is likely to arrive within that while.

Why: a request that arrives while the process sleeps in `epoll_wait` waits for its CPU to wake.
On a virtual machine whose idle vCPU halts (cpuidle `haltpoll` with `guest_halt_poll_ns` 0, as on
our 2-core CI machines), that wake-up and the cold CPU after it cost tens of microseconds per
request; polling for a while after each response takes most of that back (figures:
docs/measurements.md, "Busy polling"; `python bench/busy_poll.py`). This is the
trade Linux's haltpoll and ONNX Runtime's spinning thread pools make: CPU time for latency.

The poll runs on the loop itself, as a callback that re-schedules itself, so the loop keeps
processing every kind of event (sockets, timers, completions from instance threads) while it
polls. It yields the CPU (`sched_yield`) on each turn, so another runnable thread on the same CPU
goes first, and it stops while a batch executes on an instance thread: a computing model needs
the CPUs, and its completion wakes the loop anyway. It starts only after a response, and only if
the previous request came within the budget of the response before it: a server with sparse
traffic polls at most once per pause, and an idle server never polls. It is off on a single CPU,
where polling only delays the client.
"""

from __future__ import annotations

import asyncio
import os
import time

from oceanus.core.server import batches_on_threads

DEFAULT_BUDGET_US = 200

_yield_cpu = getattr(os, "sched_yield", lambda: None)


class BusyPoll:
    """Shared by a frontend's connections; call `request_began` and `response_sent`."""

    def __init__(self, budget_us: int, loop: asyncio.AbstractEventLoop) -> None:
        self._budget_ns = budget_us * 1000
        self._loop = loop
        self._last_sent_ns = -self._budget_ns  # no response yet: the first gap is "long"
        self._worth_it = False
        self._deadline_ns = 0
        self.polling = False
        self.turns = 0  # loop turns spent polling (tests and profiling read it)

    def request_began(self, now_ns: int) -> None:
        """A request's first byte arrived (monotonic ns): was it worth polling for?"""
        self._worth_it = now_ns - self._last_sent_ns < self._budget_ns

    def response_sent(self) -> None:
        now = time.monotonic_ns()
        self._last_sent_ns = now
        if not self._worth_it or batches_on_threads():
            return
        self._deadline_ns = now + self._budget_ns  # each response extends a running poll
        if not self.polling:
            self.polling = True
            self._loop.call_soon(self._poll)

    def _poll(self) -> None:
        if batches_on_threads() or time.monotonic_ns() >= self._deadline_ns:
            self.polling = False
            return
        self.turns += 1
        _yield_cpu()
        self._loop.call_soon(self._poll)
