"""The transport's server: gRPC over HTTP/2 on the event loop, with our own framing (framing.py).

Why not grpc.aio: its per-call cost was the gRPC frontend's ceiling (bench/grpc_echo.py measures
both transports; docs/measurements.md has the figures). Handlers are the same
`grpc.RpcMethodHandler`s grpc.aio takes, and see the few context methods they use (call.Call),
so the servicers do not know which transport serves them.

Per connection: one asyncio Protocol and its HTTP/2 state. A unary call's handler runs as a
task once its request has arrived; a streaming call's at once. Everything a loop iteration
produces for a connection leaves in one write.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import grpc

from oceanus.frontends.grpc_transport import defences
from oceanus.frontends.grpc_transport.connection import Connection


@dataclass(frozen=True)
class Limits:
    """What the connections enforce, in seconds (oceanus/parts.py converts the flags' ms)."""

    max_message: int
    keepalive_time_s: float
    keepalive_timeout_s: float
    permit_without_calls: bool
    max_pings_without_data: int
    min_ping_interval_s: float
    max_ping_strikes: int
    max_age_s: float | None = None
    age_grace_s: float | None = None
    max_concurrent_streams: int = defences.MAX_STREAMS


class H2Server:
    """Listens on one address; serves `handlers` ({"/package.Service/Method": handler})."""

    def __init__(self, handlers: dict[bytes, grpc.RpcMethodHandler], limits: Limits) -> None:
        self.handlers = handlers
        self.limits = limits
        self.connections: set[Connection] = set()
        self.paused: set[Connection] = set()
        self._server: asyncio.Server | None = None

    async def start(
        self, host: str, port: int, reuse_port: bool, ssl_context: ssl.SSLContext | None
    ) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Connection(self),
            host=host or None,
            port=port,
            reuse_port=reuse_port or None,
            ssl=ssl_context,
            backlog=1024,
        )
        sockets: Iterable[Any] = self._server.sockets
        return int(next(iter(sockets)).getsockname()[1])

    async def stop(self, grace: float | None) -> None:
        """Stop listening; with a grace, calls in flight get that long, else they end now."""
        if self._server is not None:
            self._server.close()
        connections = list(self.connections)
        if grace is None:
            for connection in connections:
                connection.cancel_calls()
        else:
            for connection in connections:
                connection.go_away()
            waits = [asyncio.ensure_future(c.drained()) for c in connections]
            if waits:
                _, late = await asyncio.wait(waits, timeout=grace)
                for wait in late:
                    wait.cancel()
            for connection in list(self.connections):
                connection.cancel_calls()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None


def ssl_context(cert: str, key: str, root: str, mutual: bool) -> ssl.SSLContext:
    """A TLS server context that offers HTTP/2 (ALPN "h2"), as gRPC clients require."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    if root:
        context.load_verify_locations(root)
    if mutual:
        context.verify_mode = ssl.CERT_REQUIRED
    context.set_alpn_protocols(["h2"])
    return context
