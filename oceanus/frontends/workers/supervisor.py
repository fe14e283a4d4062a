"""The core process's side of `--frontend-workers N`: start the worker processes, serve their
channels, restart one that dies, mirror server state to them, and drain them on shutdown.

Each worker is `python -m oceanus.frontend_worker <fd> <index> <ring prefix> <ring bytes>`,
connected to the core by a socketpair whose end it inherits (oceanus/ipc/aio.py frames the
messages), with a shared-memory ring per direction for tensor bytes (oceanus/ipc/rings.py) that
the core creates and the worker unlinks once it has mapped them: nothing is left in /dev/shm
whichever process dies. A worker that dies is replaced (its clients' connections are lost, the
other workers' clients see nothing); the core going away ends every worker, which notices its
channel closing.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import logging
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from oceanus.cpus import usable_cpus
from oceanus.frontends.workers import messages as m
from oceanus.frontends.workers.core_link import CoreLink
from oceanus.ipc import budget, msgring
from oceanus.ipc.aio import AioChannel
from oceanus.ipc.msgring import MsgRingReader, MsgRingWriter
from oceanus.ipc.rings import RING_HEADER, RingReader, RingWriter, create_ring_file

log = logging.getLogger("oceanus.workers")

# How long a new worker may take to listen on its ports and say hello.
START_TIMEOUT_S = 60.0
# A worker that dies sooner than this after starting is restarted only after a pause.
_RESTART_PAUSE_S = 1.0


def claim_port(address: str, port: int) -> int:
    """Check that nothing listens on (address, port) and return the port (a free one for port
    0). The workers then share it with SO_REUSEPORT; binding here without that option first
    makes a port another server holds (even one that shares it) an error, as without workers."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((address, port))
        return int(probe.getsockname()[1])


# Bytes of each of a worker's two tensor rings: a message's block is released as soon as its
# reader has copied the bytes out, so a ring holds what is crossing, not what is queued; a
# bigger message than fits takes a one-off file (rings.py).
RING_BYTES = 1 << 20


def remove_files(prefix: str) -> None:
    """The ring files and one-off files of a worker's link that nobody unlinked (a process died
    between creating and mapping one)."""
    for path in glob.glob(f"{prefix}-*"):
        with contextlib.suppress(OSError):
            os.unlink(path)


# Messages in shared-memory rings (ipc/msgring.py) instead of the socketpair: off by default,
# since on they measured no better at c=16 on 2 cores (docs/architecture.md, "The link": the
# socket link already batches, the ring's reader pays for its polling). The malformed records
# they once gave under load were struct.pack_into's zeroed head (fixed, msgring.py).
# OCEANUS_LINK_MSG_RINGS=1 turns them on.
MSG_RINGS = os.environ.get("OCEANUS_LINK_MSG_RINGS", "") == "1"

# Below this many usable CPUs `auto` runs no workers: on 2 CPUs the load the workers take off
# the core is eaten by the extra hop, since nothing is left for them to run on
# (bench/workers.py, docs/architecture.md: simple over HTTP 0.98x, simple_dyna 0.76x).
AUTO_MIN_CPUS = 3


def auto_workers() -> int:
    """`--frontend-workers auto`: one per usable CPU (the core process shares them), none on
    a machine too small for them to pay."""
    cpus = usable_cpus()
    return cpus if cpus >= AUTO_MIN_CPUS else 0


@dataclass
class _WorkerProcess:
    index: int
    process: subprocess.Popen[bytes] | None = None
    link: CoreLink | None = None
    prefix: str = ""
    msg_rings: tuple[MsgRingWriter, MsgRingReader] | None = None
    hello: asyncio.Future[str] | None = None
    started: float = 0.0
    stopping: bool = False
    watcher: asyncio.Task[None] | None = field(default=None, repr=False)


class FrontendWorkers:
    """N worker processes, each with its CoreLink."""

    def __init__(
        self,
        count: int,
        settings_blob: bytes,
        new_link: Callable[[], CoreLink],
        state: Callable[[], dict[str, Any]],
    ) -> None:
        self._count = count
        self._settings = settings_blob
        self._new_link = new_link
        self._state = state
        self._workers = [_WorkerProcess(index) for index in range(count)]
        self._last_state: dict[str, Any] = {}
        self._started = False
        self._stopping = False

    async def start(self) -> None:
        """Start every worker and wait until each listens; raises OSError naming what failed."""
        await asyncio.gather(*(self._spawn(worker) for worker in self._workers))
        results = await asyncio.gather(
            *(asyncio.wait_for(w.hello, START_TIMEOUT_S) for w in self._workers if w.hello),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise OSError(f"a frontend worker did not start: {result!r}")
            if result:
                raise OSError(result)
        self._started = True

    async def _spawn(self, worker: _WorkerProcess) -> None:
        loop = asyncio.get_running_loop()
        parent, child = socket.socketpair()
        link = self._new_link()
        link.on_control = self.broadcast_state
        worker.hello = loop.create_future()
        worker.link = link
        worker.prefix = prefix = (
            f"{budget.shm_dir()}/oceanus-fw-{os.getpid()}-{worker.index}-{uuid.uuid4().hex[:8]}"
        )
        capacity = self._rings(worker, link)

        def on_hello(message: m.Hello) -> None:
            if worker.hello is not None and not worker.hello.done():
                worker.hello.set_result(message.error)

        link.on_hello = on_hello
        # The link reads every message itself: no wrapper call per request.
        channel = await AioChannel.open(parent, m.KINDS, link.receive, link.lost, worker.msg_rings)
        link.channel = channel
        worker.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "oceanus.frontend_worker",
                str(child.fileno()),
                str(worker.index),
                prefix,
                str(capacity),
            ],
            pass_fds=(child.fileno(),),
        )
        child.close()
        worker.started = time.monotonic()
        channel.send(m.Settings(self._settings))
        channel.send(m.State(self._state()))
        worker.watcher = asyncio.ensure_future(self._watch(worker))

    def _rings(self, worker: _WorkerProcess, link: CoreLink) -> int:
        """Create and map the worker's rings, tensor bytes and messages, one each per direction;
        their size, 0 when /dev/shm has no room for them (then everything crosses the socket)."""
        prefix = worker.prefix
        try:
            create_ring_file(f"{prefix}-c2w", RING_BYTES)
            create_ring_file(f"{prefix}-w2c", RING_BYTES)
            if MSG_RINGS:
                msgring.create(f"{prefix}-mc2w", msgring.DEFAULT_BYTES)
                msgring.create(f"{prefix}-mw2c", msgring.DEFAULT_BYTES)
        except budget.ShmFull:
            remove_files(prefix)
            log.warning(
                "frontend worker %d: no room in %s for its rings; tensors travel inline",
                worker.index,
                budget.shm_dir(),
            )
            return 0
        link.writer = RingWriter(f"{prefix}-c2w", RING_BYTES, f"{prefix}-c-")
        link.reader = RingReader(f"{prefix}-w2c", RING_BYTES)
        held = 2 * (RING_HEADER + RING_BYTES)
        if MSG_RINGS:
            worker.msg_rings = (
                MsgRingWriter(f"{prefix}-mc2w"),
                MsgRingReader(f"{prefix}-mw2c"),
            )
            held += 2 * (msgring.HEADER + msgring.DEFAULT_BYTES)
        budget.hold(prefix, held)
        return RING_BYTES

    def _release(self, worker: _WorkerProcess) -> None:
        """The worker has exited: close its channel and rings, remove what it left in /dev/shm."""
        link = worker.link
        if link is not None:
            if link.channel is not None:
                link.channel.close()
            for ring in (link.writer, link.reader):
                if ring is not None:
                    ring.close()
            link.writer = link.reader = None
        if worker.msg_rings is not None:
            for msg_ring in worker.msg_rings:
                msg_ring.close()
            worker.msg_rings = None
        if worker.prefix:
            remove_files(worker.prefix)
            budget.drop(worker.prefix)

    async def _watch(self, worker: _WorkerProcess) -> None:
        process = worker.process
        assert process is not None
        returncode = await asyncio.get_running_loop().run_in_executor(None, process.wait)
        if self._stopping or worker.stopping:
            return
        self._release(worker)
        if worker.hello is not None and not worker.hello.done():
            worker.hello.set_result(
                f"frontend worker {worker.index} exited with status {returncode} while starting"
            )
            if not self._started:
                return  # the server's start fails, saying why
        log.error(
            "frontend worker %d (pid %d) exited with status %d; starting a new one",
            worker.index,
            process.pid,
            returncode,
        )
        if time.monotonic() - worker.started < _RESTART_PAUSE_S:
            await asyncio.sleep(_RESTART_PAUSE_S)
        if self._stopping:
            return
        await self._spawn(worker)
        assert worker.hello is not None
        try:
            error = await asyncio.wait_for(worker.hello, START_TIMEOUT_S)
        except asyncio.TimeoutError:
            error = "it did not say hello"
        if error:
            log.error("frontend worker %d failed to restart: %s", worker.index, error)

    def broadcast_state(self) -> None:
        """Send the mirrored server state to every worker when it changed."""
        state = self._state()
        if state == self._last_state:
            return
        self._last_state = state
        for worker in self._workers:
            if worker.link is not None and worker.link.channel is not None:
                worker.link.channel.send(m.State(state))

    async def stop(self, timeout_s: float) -> bool:
        """Drain: every worker stops accepting, finishes what it has (up to `timeout_s`), exits.
        Returns whether every worker finished its requests in time (exit status 0)."""
        drained = True
        self._stopping = True
        for worker in self._workers:
            worker.stopping = True
            if worker.link is not None and worker.link.channel is not None:
                worker.link.channel.send(m.Drain())
        deadline = time.monotonic() + timeout_s + 5.0
        for worker in self._workers:
            process = worker.process
            if process is None:
                continue
            while process.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            if process.poll() is None:
                log.warning("frontend worker %d did not stop in time; killing it", worker.index)
                process.kill()
                await asyncio.get_running_loop().run_in_executor(None, process.wait)
            drained = drained and process.returncode == 0
            if worker.watcher is not None:
                worker.watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await worker.watcher
            self._release(worker)
        return drained
