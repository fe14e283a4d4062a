"""grpc core's keepalive and ping policy for one connection of the transport: our pings (a peer
that answers none is dropped) and the client's (too close together while no data flows are
strikes; past the limit, GOAWAY ENHANCE_YOUR_CALM)."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from oceanus.frontends.grpc_transport import framing, wire

if TYPE_CHECKING:
    from oceanus.frontends.grpc_transport.server import Limits

log = logging.getLogger("oceanus.grpc")

_NO_CALLS_PING_INTERVAL_S = 7200.0  # grpc core: pings without calls, when not permitted


class Pings:
    """The connection's pings both ways. `has_calls` says whether calls are open, `flush`
    writes what the framing queued, `close` closes the connection."""

    def __init__(
        self,
        limits: Limits,
        h2: framing.Http2,
        has_calls: Callable[[], bool],
        flush: Callable[[], None],
        close: Callable[[], None],
    ) -> None:
        self._limits = limits
        self._h2 = h2
        self._has_calls = has_calls
        self._flush = flush
        self._close = close
        self._loop = asyncio.get_running_loop()
        self._due: asyncio.TimerHandle | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self.unanswered = 0
        self.without_data = 0
        self._last_received: float | None = None
        self._strikes = 0
        self.peer = ""

    def start(self) -> None:
        if self._limits.keepalive_time_s < 2**31 / 1000:
            self._due = self._loop.call_later(self._limits.keepalive_time_s, self._ping)

    def stop(self) -> None:
        for handle in (self._due, self._deadline):
            if handle is not None:
                handle.cancel()

    def data_sent(self) -> None:
        """Headers or data go out: the ping policy starts over (grpc core's rule: a client's
        pings count against it only while the server sends nothing)."""
        self.without_data = 0
        self._strikes = 0
        self._last_received = None

    def _ping(self) -> None:
        limits = self._limits
        if self.unanswered:
            log.debug("gRPC connection from %s: keepalive ping unanswered", self.peer)
            self._close()
            return
        allowed = self._has_calls() or limits.permit_without_calls
        limit = limits.max_pings_without_data
        if allowed and (limit == 0 or self.without_data < limit):
            self._h2.ping(os.urandom(8))
            self.unanswered += 1
            self.without_data += 1
            self._flush()
            self._deadline = self._loop.call_later(limits.keepalive_timeout_s, self._late)
        self.start()

    def _late(self) -> None:
        if self.unanswered:
            log.debug("gRPC connection from %s: keepalive ping timed out", self.peer)
            self._close()

    def received(self) -> None:
        """A client's ping: a strike if it comes sooner than allowed."""
        limits = self._limits
        now = time.monotonic()
        if self._has_calls() or limits.permit_without_calls:
            interval = limits.min_ping_interval_s
        else:
            interval = _NO_CALLS_PING_INTERVAL_S
        last, self._last_received = self._last_received, now
        if last is None or now - last >= interval:
            return
        self._strikes += 1
        if self._strikes > limits.max_ping_strikes > 0:
            self._h2.goaway(wire.ENHANCE_YOUR_CALM, b"too_many_pings")
            self._flush()
            self._close()
