"""The built-in load generator, for machines without perf_analyzer: a closed loop of N
keep-alive HTTP connections, each sending one KServe v2 binary-tensor request and waiting for
its answer before sending the next, as perf_analyzer's concurrency mode does.

The request is encoded once (random data of the model's input types and shapes, one row) and
written as prebuilt bytes; responses are parsed with httptools, so the client spends its CPU on
the socket rather than on Python HTTP machinery. Still, it is Python: on a small machine it
costs the server CPU that perf_analyzer would not, which is why perf_analyzer is preferred.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, cast

import httptools
import numpy as np

from oceanus.core import datatypes


@dataclass(frozen=True)
class LoadResult:
    completed: int  # answers inside the window
    errors: int  # non-200 answers or broken connections inside the window
    window_s: float
    latencies_us: list[float]


def _sample(datatype: str, shape: list[int], rng: np.random.Generator) -> bytes:
    kind = datatypes.from_name(datatype)
    if kind is None:
        raise ValueError(f"unsupported datatype {datatype}")
    count = int(np.prod(shape)) if shape else 1
    if kind.is_bytes:
        return datatypes.serialize_bytes(np.array([b"oceanus"] * count, dtype=object))
    if datatype == "BF16":  # small positive numbers, as raw bfloat16 bits
        return np.full(count, 0x3F80, dtype=np.uint16).tobytes()
    if kind.dtype.kind == "b":
        return rng.integers(0, 2, count).astype(np.bool_).tobytes()
    if kind.dtype.kind in "iu":
        return rng.integers(0, 100, count).astype(kind.dtype).tobytes()
    return rng.random(count).astype(kind.dtype).tobytes()


def build_request(
    model: str, metadata: dict[str, Any], max_batch_size: int, host: str, seed: int = 0
) -> bytes:
    """One complete HTTP/1.1 request (headers and body) for a one-row inference."""
    rng = np.random.default_rng(seed)
    inputs = []
    blobs = []
    for item in metadata["inputs"]:
        shape = [int(d) for d in item["shape"]]
        if max_batch_size > 0 and shape:
            shape[0] = 1  # the batch dimension
        shape = [1 if d < 0 else d for d in shape]
        raw = _sample(item["datatype"], shape, rng)
        inputs.append(
            {
                "name": item["name"],
                "datatype": item["datatype"],
                "shape": shape,
                "parameters": {"binary_data_size": len(raw)},
            }
        )
        blobs.append(raw)
    outputs = [
        {"name": o["name"], "parameters": {"binary_data": True}} for o in metadata["outputs"]
    ]
    header = json.dumps({"inputs": inputs, "outputs": outputs}).encode()
    body = header + b"".join(blobs)
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\n"
        f"Host: {host}\r\n"
        "Content-Type: application/octet-stream\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class _Connection(asyncio.Protocol):
    """One keep-alive connection with at most one request in flight."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[int] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(self.parser.get_status_code())

    def connection_lost(self, exc: Exception | None) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionError("the server closed the connection"))

    def send(self, payload: bytes) -> asyncio.Future[int]:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(payload)
        return self.waiter


async def _closed_loop(
    host: str, port: int, payload: bytes, concurrency: int, warmup_s: float, window_s: float
) -> LoadResult:
    loop = asyncio.get_running_loop()
    connections = []
    for _ in range(concurrency):
        _, protocol = await loop.create_connection(_Connection, host, port)
        connections.append(protocol)
    begin = time.perf_counter() + warmup_s
    end = begin + window_s
    latencies: list[float] = []
    errors = 0

    async def worker(connection: _Connection) -> None:
        nonlocal errors
        while True:
            sent = time.perf_counter()
            if sent >= end:
                return
            try:
                status = await connection.send(payload)
            except ConnectionError:
                if sent >= begin:
                    errors += 1
                return
            done = time.perf_counter()
            if begin <= sent and done <= end:
                if status == 200:
                    latencies.append((done - sent) * 1e6)
                else:
                    errors += 1

    try:
        await asyncio.gather(*(worker(c) for c in connections))
    finally:
        for connection in connections:
            if connection.transport is not None:
                connection.transport.close()
    return LoadResult(len(latencies), errors, window_s, latencies)


def run_load(
    host: str,
    port: int,
    payload: bytes,
    concurrency: int,
    window_s: float,
    warmup_s: float = 0.25,
) -> LoadResult:
    """Measure one concurrency level: `warmup_s` unmeasured, then `window_s` measured."""
    try:
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(
            _closed_loop(host, port, payload, concurrency, warmup_s, window_s)
        )
    finally:
        loop.close()
