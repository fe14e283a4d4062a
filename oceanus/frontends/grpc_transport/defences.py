"""Per-connection budgets against a peer that floods (issue 42), counted apart from the framing.

The framing counts what each frame costs here and turns an exhausted budget into GOAWAY
ENHANCE_YOUR_CALM; docs/reliability.md lists these limits.
"""

from __future__ import annotations

from collections.abc import Callable

# Streams a client may have open at once (announced, and enforced with REFUSED_STREAM); the
# server's --grpc-max-concurrent-streams. grpc core announces none; clients queue calls past
# the announced number, so a finite one costs a well-behaved client nothing.
MAX_STREAMS = 1000
# Frames parsed per `receive` call: the rest waits for the next loop turn, so one connection's
# flood never holds the loop for more than this many frames at a time.
FRAMES_PER_TURN = 1000
# Frames that do no work for a call (SETTINGS, PING, PRIORITY, WINDOW_UPDATE, RST_STREAM,
# empty DATA and CONTINUATION, unknown types, streams refused) are counted per window of
# FLOOD_WINDOW_S; past FLOOD_FRAMES (or 4 per frame that does work, when more) the peer gets
# GOAWAY ENHANCE_YOUR_CALM. The answer to CVE-2019-9512/9514/9515/9518 (ping, reset, settings,
# empty-frame floods), CVE-2019-9513 (priority churn), CVE-2023-44487 (rapid reset: each
# reset of an open stream counts) and CVE-2024-27316 (CONTINUATION, also bounded per block).
FLOOD_WINDOW_S = 1.0
FLOOD_FRAMES = 10_000
# Streams a client resets before their answer, per window (rapid reset): nghttp2's burst.
RESETS_PER_WINDOW = 1000
# Header lists of at most this many bytes (announced; hpack refuses longer ones).
MAX_HEADER_LIST = 64 << 10
# A header block is refused past this many bytes or CONTINUATION frames (RFC 9113 10.5: a
# CONTINUATION flood costs the receiver without ever ending).
MAX_HEADER_BLOCK = MAX_HEADER_LIST + 1024
MAX_CONTINUATIONS = 64


class FloodBudget:
    """One connection's counts in the current window of FLOOD_WINDOW_S: frames that did no
    work, frames that did (requests and DATA with bytes: the framing adds to `useful_frames`),
    open streams the client reset."""

    __slots__ = ("_clock", "_window_start", "idle_frames", "resets", "useful_frames")

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._window_start = clock()
        self.idle_frames = 0
        self.useful_frames = 0
        self.resets = 0

    def spend_idle(self) -> bool:
        """Counts a frame that did no work; False once past the window's allowance."""
        self.idle_frames += 1
        if self.idle_frames <= FLOOD_FRAMES or self.idle_frames <= 4 * self.useful_frames:
            return True
        return self._new_window()

    def spend_reset(self) -> bool:
        """Counts an open stream the client reset; False once past RESETS_PER_WINDOW."""
        self.resets += 1
        return self.resets <= RESETS_PER_WINDOW or self._new_window()

    def _new_window(self) -> bool:
        """Starts a new counting window if the current one has passed."""
        now = self._clock()
        if now - self._window_start < FLOOD_WINDOW_S:
            return False
        self._window_start = now
        self.idle_frames = self.useful_frames = self.resets = 0
        return True
