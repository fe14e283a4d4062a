"""bench/reliability.py's instruments: the server's processes (RSS, open fds), a recorder of
latencies and failures by cause, and the HTTP and gRPC clients its phases drive."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import benchlib  # bench/ is on the path: reliability.py, the entry point, puts it there
import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb

# ---- the server's processes -----------------------------------------------------------------


def server_pids(core: int) -> list[int]:
    """The core process and its children (frontend workers, Python model stubs)."""
    pids = [core]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == core:
                    pids.append(int(entry.name))
    return pids


def footprint(core: int) -> tuple[float, int]:
    """(RSS in MiB, open file descriptors) summed over the server's processes."""
    rss, fds = 0, 0
    for pid in server_pids(core):
        rss += benchlib.status_kib(pid, "VmRSS")
        with contextlib.suppress(OSError):
            fds += len(os.listdir(f"/proc/{pid}/fd"))
    return rss / 1024, fds


class Recorder:
    """Latencies and failures of one phase, and the server's footprint over it."""

    def __init__(self, core: int) -> None:
        self.core = core
        self.latencies: list[float] = []
        self.failures: Counter[str] = Counter()
        self.failure_latencies: list[float] = []
        self.start = footprint(core)
        self.peak = self.start
        self.samples: list[tuple[float, float, int]] = []

    def sample(self) -> None:
        now = footprint(self.core)
        self.samples.append((time.monotonic(), *now))
        self.peak = (max(self.peak[0], now[0]), max(self.peak[1], now[1]))

    async def sampler(self, interval: float = 1.0) -> None:
        while True:
            self.sample()
            await asyncio.sleep(interval)

    async def row(self, phase: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The phase's figures; the clients' connections are closed and the server left idle
        for two seconds first, so "after" is what the load left behind."""
        await HttpClient.close_all()
        await asyncio.sleep(2)
        after = footprint(self.core)
        ok = sorted(self.latencies)
        return {
            "phase": phase,
            "requests": len(ok) + sum(self.failures.values()),
            "failures": dict(self.failures),
            "p50_ms": round(benchlib.percentile(ok, 50) * 1000, 2) if ok else None,
            "p99_ms": round(benchlib.percentile(ok, 99) * 1000, 2) if ok else None,
            # How fast refusals come (a queue limit must answer at once, not after a wait).
            "failure_p99_ms": (
                round(benchlib.percentile(sorted(self.failure_latencies), 99) * 1000, 2)
                if self.failure_latencies
                else None
            ),
            "rss_mib": [round(self.start[0], 1), round(self.peak[0], 1), round(after[0], 1)],
            "fds": [self.start[1], self.peak[1], after[1]],
            **(extra or {}),
        }


# ---- clients -------------------------------------------------------------------------------


class HttpClient:
    """One keep-alive HTTP/1.1 connection (all of them are closed by `close_all`)."""

    opened: list[HttpClient] = []

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        HttpClient.opened.append(self)

    @classmethod
    async def close_all(cls) -> None:
        for client in cls.opened:
            if client.writer is not None:
                client.writer.close()
                with contextlib.suppress(Exception):
                    await client.writer.wait_closed()
        cls.opened = []

    async def post(self, path: str, body: bytes) -> int:
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
        return await self._exchange(head.encode() + body)

    async def get(self, path: str) -> int:
        return await self._exchange(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())

    async def _exchange(self, request: bytes) -> int:
        """Send one request, read its whole answer; its status."""
        if self.writer is None or self.writer.is_closing():
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        self.writer.write(request)
        status = int((await self.reader.readline()).split()[1])
        length, close = 0, False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
            elif name.lower() == "connection" and value.strip().lower() == "close":
                close = True
        await self.reader.readexactly(length)
        if close:
            self.writer.close()
        return status


async def closed_loop(
    recorder: Recorder, call: Callable[[], Awaitable[str | None]], stop_at: float
) -> None:
    """One client: requests back to back until `stop_at`; a failure is named by `call`."""
    while time.monotonic() < stop_at:
        started = time.perf_counter()
        try:
            failure = await call()
        except Exception as exc:  # a reset, a refused connection: counted, never fatal
            failure = type(exc).__name__
        if failure is None:
            recorder.latencies.append(time.perf_counter() - started)
        else:
            recorder.failures[failure] += 1
            recorder.failure_latencies.append(time.perf_counter() - started)


def http_call(client: HttpClient, path: str, body: bytes) -> Callable[[], Awaitable[str | None]]:
    async def call() -> str | None:
        status = await client.post(path, body)
        return None if status == 200 else f"HTTP {status}"

    return call


def grpc_call(channel: grpc.aio.Channel) -> Callable[[], Awaitable[str | None]]:
    method = channel.unary_unary(
        "/inference.GRPCInferenceService/ModelInfer",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=pb.ModelInferResponse.FromString,
    )
    request = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        request.raw_input_contents.append(np.ones(16, dtype=np.int32).tobytes())

    async def call() -> str | None:
        try:
            await method(request, timeout=30)
        except grpc.aio.AioRpcError as error:
            return f"gRPC {error.code().name}"
        return None

    return call
