"""What the framing tells the connection as frames complete (the connection implements `Events`),
and the connection errors it raises.

Method calls instead of event objects keep a gRPC request cheap (framing.py says why).
"""

from __future__ import annotations

from typing import Protocol


class ConnectionError_(Exception):
    """A connection error (RFC 9113 5.4.1): GOAWAY with `code`, then close."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class Events(Protocol):
    """What the connection is told, as it happens."""

    def on_request(self, stream_id: int, headers: list[tuple[bytes, bytes]]) -> None: ...
    def on_data(self, stream_id: int, data: bytes) -> None: ...
    def on_end(self, stream_id: int) -> None: ...
    def on_reset(self, stream_id: int) -> None: ...
    def on_window(self, stream_id: int) -> None: ...
    def on_ping(self) -> None: ...
    def on_ping_ack(self) -> None: ...
    def on_goaway(self) -> None: ...
