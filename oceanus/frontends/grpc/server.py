"""The gRPC frontend's server on the running event loop, with Triton's options: our HTTP/2
transport (frontends/grpc_transport/) by default, grpc.aio when OCEANUS_GRPC_TRANSPORT=grpcio."""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import grpc

from oceanus.frontends.grpc import health
from oceanus.frontends.grpc.methods import SERVICE_NAME
from oceanus.frontends.grpc_transport.server import H2Server, Limits, ssl_context

log = logging.getLogger("oceanus.grpc")

# Triton's MAX_GRPC_MESSAGE_SIZE: messages up to 2 GiB both ways (grpcio's default is 4 MiB in).
MAX_MESSAGE_SIZE = 2**31 - 1


@dataclass
class GrpcOptions:
    """What the gRPC frontend is told at start (the `--grpc-*` flags, by oceanus/parts.py)."""

    # message size, keepalive, pings and connection age, in seconds
    limits: Limits
    address: str = "0.0.0.0"
    port: int = 8001
    reuse_port: bool = False
    # category -> (metadata key, value), see frontends/restricted.py
    restricted: dict[str, tuple[str, str]] = field(default_factory=dict)
    use_ssl: bool = False
    use_ssl_mutual: bool = False
    server_cert: str = ""
    server_key: str = ""
    root_cert: str = ""

    def channel_options(self) -> list[tuple[str, int]]:
        """grpc.aio's options: the same limits, in grpcio's milliseconds."""
        limits = self.limits
        options = [
            ("grpc.max_send_message_length", limits.max_message),
            ("grpc.max_receive_message_length", limits.max_message),
            # grpcio shares ports by default; like Triton, only when asked to
            ("grpc.so_reuseport", int(self.reuse_port)),
            ("grpc.keepalive_time_ms", _ms(limits.keepalive_time_s)),
            ("grpc.keepalive_timeout_ms", _ms(limits.keepalive_timeout_s)),
            ("grpc.keepalive_permit_without_calls", int(limits.permit_without_calls)),
            ("grpc.http2.max_pings_without_data", limits.max_pings_without_data),
            ("grpc.http2.min_ping_interval_without_data_ms", _ms(limits.min_ping_interval_s)),
            ("grpc.http2.max_ping_strikes", limits.max_ping_strikes),
            ("grpc.max_concurrent_streams", limits.max_concurrent_streams),
        ]
        if limits.max_age_s is not None:
            options.append(("grpc.max_connection_age_ms", _ms(limits.max_age_s)))
        if limits.age_grace_s is not None:
            options.append(("grpc.max_connection_age_grace_ms", _ms(limits.age_grace_s)))
        return options

    def credentials(self) -> grpc.ServerCredentials | None:
        if not (self.use_ssl or self.use_ssl_mutual):
            return None
        key = Path(self.server_key).read_bytes()
        cert = Path(self.server_cert).read_bytes()
        root = Path(self.root_cert).read_bytes() if self.root_cert else None
        return grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=root, require_client_auth=self.use_ssl_mutual
        )

    def ssl_context(self) -> ssl.SSLContext | None:
        if not (self.use_ssl or self.use_ssl_mutual):
            return None
        return ssl_context(
            self.server_cert, self.server_key, self.root_cert, mutual=self.use_ssl_mutual
        )

    @property
    def host(self) -> str:
        return self.address.removeprefix("[").removesuffix("]")

    @property
    def endpoint(self) -> str:
        host = self.address
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"{host}:{self.port}"


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


class Servicer(Protocol):
    """What serves the RPCs: the in-process GrpcService, or a frontend worker's handlers."""

    # Set on shutdown: open streams answer what they have received, then end.
    draining: asyncio.Event

    def method_handlers(self) -> dict[str, grpc.RpcMethodHandler]: ...

    def health_handlers(self) -> dict[str, grpc.RpcMethodHandler]: ...


def transport() -> str:
    """ "h2" (the default) or "grpcio": the escape hatch should the h2 transport misbehave."""
    return os.environ.get("OCEANUS_GRPC_TRANSPORT", "h2")


class GrpcFrontend:
    """Owns the gRPC server; `start()` and `stop()` run on the server's event loop."""

    def __init__(self, service: Servicer, options: GrpcOptions) -> None:
        self.options = options
        self.service = service
        self._server: grpc.aio.Server | H2Server | None = None

    async def start(self) -> None:
        if transport() == "grpcio":
            log.info("gRPC on grpc.aio (OCEANUS_GRPC_TRANSPORT=grpcio)")
            await self._start_grpcio()
            return
        options = self.options
        handlers = {
            f"/{SERVICE_NAME}/{method}".encode(): handler
            for method, handler in self.service.method_handlers().items()
        }
        for method, handler in self.service.health_handlers().items():
            handlers[f"/{health.SERVICE_NAME}/{method}".encode()] = handler
        server = H2Server(handlers, options.limits)
        try:
            await server.start(
                options.host, options.port, options.reuse_port, options.ssl_context()
            )
        except (OSError, ssl.SSLError) as exc:
            raise OSError(f"failed to start GRPC service on {options.endpoint}: {exc}") from None
        self._server = server

    async def _start_grpcio(self) -> None:
        options = self.options
        server = grpc.aio.server(options=options.channel_options())
        handlers = self.service.method_handlers()
        health_handlers = self.service.health_handlers()
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),
                grpc.method_handlers_generic_handler(health.SERVICE_NAME, health_handlers),
            )
        )
        server.add_registered_method_handlers(SERVICE_NAME, handlers)
        server.add_registered_method_handlers(health.SERVICE_NAME, health_handlers)
        credentials = options.credentials()
        try:
            if credentials is None:
                port = server.add_insecure_port(options.endpoint)
            else:
                port = server.add_secure_port(options.endpoint, credentials)
        except RuntimeError as exc:
            raise OSError(f"failed to start GRPC service on {options.endpoint}: {exc}") from None
        if port == 0:
            raise OSError(f"failed to start GRPC service on {options.endpoint}")
        await server.start()
        self._server = server

    async def stop(self, grace: float | None = None) -> None:
        """Stop accepting RPCs; in-flight ones get `grace` seconds to finish, and open streams
        end once they have answered every request they sent."""
        self.service.draining.set()
        if self._server is None:
            return
        server, self._server = self._server, None
        await server.stop(grace)
