"""Receive flow control (RFC 9113 6.9): what a peer may still send us, refilled as the
application consumes what it sent, so a client sending faster than its handler reads is held
by its windows, not buffered without bound (issue 42)."""

from __future__ import annotations

# Receive windows: large enough that a tensor of a few MiB crosses without waiting for a
# WINDOW_UPDATE round trip; the call's message limit bounds what a call may buffer.
WINDOW = 16 << 20


class Inflow:
    """One receive window, of the connection or of a stream: bytes received and not yet given
    back by a WINDOW_UPDATE (the framing counts them, and refuses DATA past WINDOW), and those
    of them consumed since the last one."""

    __slots__ = ("consumed", "received")

    def __init__(self) -> None:
        self.received = 0
        self.consumed = 0

    def give_back(self, size: int) -> int:
        """Counts `size` bytes consumed; the increment to announce now, once half a window is
        consumed (0 before: one WINDOW_UPDATE per half window, not one per message)."""
        self.consumed += size
        if self.consumed < WINDOW // 2:
            return 0
        increment, self.consumed = self.consumed, 0
        self.received -= increment
        return increment


class Stream(Inflow):
    """A client stream the framing has not finished: our send window, its receive window,
    whether the client may still send, and how much, when content-length said."""

    __slots__ = ("length", "remote_open", "send_window")

    def __init__(self, send_window: int, length: int) -> None:
        self.received = self.consumed = 0  # Inflow's, without a call per request
        self.send_window = send_window
        self.remote_open = True
        self.length = length  # DATA bytes still to come, as content-length said (-1: not said)
