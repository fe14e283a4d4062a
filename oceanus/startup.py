"""What is checked before any model loads: the repository folders exist and every port the
server will listen on can be bound. A failure is one line naming the flag, and exit code 1,
within a second, instead of an error from deep inside a frontend after every model has loaded
(Triton, too, only finds a taken port once its models are loaded)."""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass
from pathlib import Path

from oceanus.frontends.workers.supervisor import claim_port
from oceanus.settings import Settings
from oceanus.storage import is_remote


@dataclass(frozen=True)
class Listener:
    flag: str  # "--http-port"
    address_flag: str  # "--http-address"
    address: str
    port: int


def listeners(settings: Settings) -> list[Listener]:
    """The ports this server will listen on (port 0: any free port, nothing to check)."""
    wanted = [
        (settings.allow_http, "http", settings.http_address, settings.http_port),
        (settings.allow_grpc, "grpc", settings.grpc_address, settings.grpc_port),
        (settings.allow_metrics, "metrics", settings.metrics_address, settings.metrics_port),
    ]
    if settings.openai_port is not None:
        wanted.append((True, "openai", settings.http_address, settings.openai_port))
    return [
        Listener(
            f"--{name}-port",
            "--http-address" if name == "openai" else f"--{name}-address",
            address,
            port,
        )
        for enabled, name, address, port in wanted
        if enabled and port > 0
    ]


def check_repositories(settings: Settings) -> str | None:
    """The first local --model-repository that is not a folder, in Triton's words plus what to
    do."""
    for path in settings.model_repositories:
        if is_remote(path):  # object storage: checked when it is fetched
            continue
        if not Path(path).expanduser().is_dir():
            what = "is not a folder" if Path(path).expanduser().exists() else "does not exist"
            return f"failed to stat file {path}: --model-repository {path} {what}"
    return None


def check_ports(settings: Settings) -> str | None:
    """The first port that cannot be bound (or that two flags share), in one line."""
    seen: dict[int, Listener] = {}
    for listener in listeners(settings):
        other = seen.get(listener.port)
        if other is not None and _overlap(other.address, listener.address):
            return (
                f"failed to start: {other.flag} and {listener.flag} are both {listener.port}; "
                "give each service its own port"
            )
        seen[listener.port] = listener
        problem = _bind_problem(listener)
        if problem is not None:
            return problem
    return None


def _overlap(first: str, second: str) -> bool:
    wildcard = ("0.0.0.0", "::", "")
    return first == second or first in wildcard or second in wildcard


def _bind_problem(listener: Listener) -> str | None:
    where = f"{listener.flag} {listener.port}"
    try:
        claim_port(listener.address, listener.port)
    except socket.gaierror as exc:
        return f"failed to start: {listener.address_flag} {listener.address}: {exc.strerror}"
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return (
                f"failed to start: {where} is already in use on {listener.address} (stop what "
                f"listens there, or choose another port with {listener.flag})"
            )
        if exc.errno == errno.EACCES:
            return (
                f"failed to start: {where}: permission denied on {listener.address} (ports "
                f"below 1024 need privileges; choose another with {listener.flag})"
            )
        if exc.errno == errno.EADDRNOTAVAIL:
            return (
                f"failed to start: {listener.address_flag} {listener.address}: not an address "
                f"of this machine (for {where})"
            )
        return f"failed to start: {where} on {listener.address}: {exc.strerror or exc}"
    return None
