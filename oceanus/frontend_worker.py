"""A frontend worker process (`--frontend-workers`): HTTP and gRPC on the server's ports, shared
with the other workers (SO_REUSEPORT), the core in the process that started it.

Started as `python -m oceanus.frontend_worker <fd> <index> <ring prefix> <ring bytes>` by
frontends/workers/supervisor.py, with one end of a socketpair as `fd` and the two tensor rings the
core made (mapped, then unlinked at once; ring bytes 0: none): the core process sends the
server's settings first, then state updates; the worker serves until the core asks it to drain
(or SIGTERM / SIGINT come to it directly), or exits at once if the core process disappears:
a worker never serves without a core.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import signal
import socket
import sys
from collections.abc import Sequence
from typing import Any

from oceanus.frontends.grpc.server import GrpcFrontend
from oceanus.frontends.http.protocol import HttpServer
from oceanus.frontends.workers import messages as m
from oceanus.frontends.workers.client import CoreClient
from oceanus.frontends.workers.handlers import WorkerGrpc, WorkerHttp
from oceanus.frontends.workers.openai_routes import worker_openai
from oceanus.frontends.workers.supervisor import remove_files
from oceanus.ipc.aio import AioChannel
from oceanus.ipc.msgring import MsgRingReader, MsgRingWriter
from oceanus.ipc.rings import RingReader, RingWriter
from oceanus.logs import LogSettings, configure
from oceanus.main import install_uvloop
from oceanus.parts import grpc_options, http_server
from oceanus.settings import Settings

log = logging.getLogger("oceanus.workers")


class _FrontendWorker:
    def __init__(self, index: int, prefix: str, ring_bytes: int) -> None:
        self.index = index
        self.prefix = prefix
        self.client = CoreClient()
        self.msg_rings: tuple[MsgRingWriter, MsgRingReader] | None = None
        if ring_bytes:
            try:
                self.client.reader = RingReader(f"{prefix}-c2w", ring_bytes)
                self.client.writer = RingWriter(f"{prefix}-w2c", ring_bytes, f"{prefix}-w-")
                if os.path.exists(f"{prefix}-mc2w"):  # the core made message rings too
                    self.msg_rings = (
                        MsgRingWriter(f"{prefix}-mw2c"),
                        MsgRingReader(f"{prefix}-mc2w"),
                    )
            finally:  # both ends have mapped them: the names are no longer needed
                for direction in ("c2w", "w2c", "mc2w", "mw2c"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(f"{prefix}-{direction}")
        self.drain = asyncio.Event()
        self.core_lost = asyncio.Event()
        self.settings: asyncio.Future[Settings] = asyncio.get_running_loop().create_future()
        self._log: dict[str, Any] | None = None
        self.client.on_drain = self.drain.set
        self.client.on_settings = self._settings
        self.client.on_state = self._state

    def _settings(self, data: bytes) -> None:
        if not self.settings.done():
            self.settings.set_result(pickle.loads(data))

    def _state(self, state: dict[str, Any]) -> None:
        log_settings = state.get("log")
        if log_settings is not None and log_settings != self._log:
            self._log = log_settings
            configure(LogSettings(**log_settings))

    def _lost(self) -> None:
        self.client.lost()
        self.core_lost.set()

    async def serve(self, sock: socket.socket) -> int:
        channel = await AioChannel.open(
            sock, m.KINDS, self.client.receive, self._lost, self.msg_rings
        )
        self.client.channel = channel
        settings = await self.settings
        configure(settings.log)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self.drain.set)
        http: HttpServer | None = None
        grpc: GrpcFrontend | None = None
        error = ""
        try:
            if settings.allow_http:
                openai = worker_openai(
                    self.client,
                    settings.chat_template,
                    settings.http_restricted_apis,
                    settings.http_max_input_size,
                )
                handler = WorkerHttp(
                    self.client,
                    settings.http_max_input_size,
                    settings.http_restricted_apis,
                    settings.http_header_forward_pattern,
                    openai.handle,
                )
                http = http_server(settings, handler.handle)
                await http.start(settings.http_address, settings.http_port, reuse_port=True)
            if settings.allow_grpc:
                options = grpc_options(settings, reuse_port=True)
                service = WorkerGrpc(
                    self.client, options.restricted, settings.grpc_header_forward_pattern
                )
                grpc = GrpcFrontend(service, options)
                await grpc.start()
        except OSError as exc:
            error = f"frontend worker {self.index}: {exc.strerror or exc}"
        channel.send(m.Hello(self.index, os.getpid(), error))
        if error:
            channel.close()
            return 1
        waits = [
            asyncio.ensure_future(self.drain.wait()),
            asyncio.ensure_future(self.core_lost.wait()),
        ]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for waiting in waits:
            waiting.cancel()
        if self.core_lost.is_set():
            remove_files(self.prefix)  # one-off files the core died before reading
            log.error("frontend worker %d: the core process has gone; exiting", self.index)
            return 1
        log.info("frontend worker %d: draining", self.index)
        timeout = settings.exit_timeout_secs
        # HTTP and gRPC drain at once; exit status 1 tells the core a request was cut off.
        drained = await asyncio.gather(
            http.stop(timeout) if http is not None else _done(),
            _stop_grpc(grpc, timeout),
        )
        channel.close()
        log.info("frontend worker %d: stopped", self.index)
        return 0 if all(drained) else 1


async def _done() -> bool:
    return True


async def _stop_grpc(grpc: GrpcFrontend | None, timeout: float) -> bool:
    if grpc is not None:
        await grpc.stop(timeout)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    fd, index, prefix, ring_bytes = int(args[0]), int(args[1]), args[2], int(args[3])
    install_uvloop()

    async def run() -> int:
        worker = _FrontendWorker(index, prefix, ring_bytes)
        return await worker.serve(socket.socket(fileno=fd))

    return asyncio.run(run())


if __name__ == "__main__":
    sys.exit(main())
