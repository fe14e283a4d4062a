"""Busy polling after a response (oceanus/frontends/http/busy_poll.py), on a real uvloop loop and
through the real HTTP protocol on a loopback socket."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import uvloop

from oceanus.core.scheduling.instance import ThreadBatches
from oceanus.cpus import usable_cpus
from oceanus.frontends.http.busy_poll import BusyPoll
from oceanus.frontends.http.protocol import HttpRequest, HttpResponse, HttpServer


@pytest.fixture(autouse=True)
def no_thread_batches() -> Iterator[None]:
    """Start from no batch on an instance thread, whatever in-process cores of other tests
    left behind (the count is process-wide)."""
    saved = ThreadBatches.executing
    ThreadBatches.executing = 0
    yield
    ThreadBatches.executing = saved


def run(test: Callable[[], Awaitable[Any]]) -> Any:
    return uvloop.run(test())


def answer(poll: BusyPoll) -> None:
    """One request arrives now and is answered at once."""
    poll.request_began(time.monotonic_ns())
    poll.response_sent()


def test_an_idle_server_and_sparse_requests_never_poll() -> None:
    async def main() -> None:
        poll = BusyPoll(50_000, asyncio.get_running_loop())
        answer(poll)  # the first request: no response before it
        assert not poll.polling
        await asyncio.sleep(0.06)  # the next request comes after more than the budget
        answer(poll)
        assert not poll.polling
        assert poll.turns == 0

    run(main)


def test_close_requests_poll_until_the_budget_passes() -> None:
    async def main() -> None:
        poll = BusyPoll(300_000, asyncio.get_running_loop())
        answer(poll)
        answer(poll)  # right after a response: worth polling
        assert poll.polling
        await asyncio.sleep(0.01)  # the loop keeps running timers while it polls
        assert poll.polling
        assert poll.turns > 0
        await asyncio.sleep(0.6)
        assert not poll.polling
        turns = poll.turns
        await asyncio.sleep(0.01)
        assert poll.turns == turns  # stopped for good

    run(main)


def test_each_response_extends_a_running_poll() -> None:
    async def main() -> None:
        poll = BusyPoll(1_000_000, asyncio.get_running_loop())  # 1 s
        answer(poll)
        answer(poll)
        await asyncio.sleep(0.6)
        answer(poll)  # now polls until 1.6 s
        await asyncio.sleep(0.6)
        assert poll.polling  # past the first deadline (1.0 s)

    run(main)


def test_no_polling_while_a_batch_executes_on_an_instance_thread() -> None:
    async def main() -> None:
        poll = BusyPoll(1_000_000, asyncio.get_running_loop())
        answer(poll)
        poll.request_began(time.monotonic_ns())
        ThreadBatches.executing = 1  # as InstanceThread.submit counts a batch
        poll.response_sent()
        assert not poll.polling
        ThreadBatches.executing = 0
        answer(poll)
        assert poll.polling
        await asyncio.sleep(0.01)
        ThreadBatches.executing = 1  # a batch starts while it polls: the poll stops
        await asyncio.sleep(0.01)
        assert not poll.polling

    run(main)


async def _exchange(port: int, count: int) -> list[bytes]:
    """`count` requests one after the other on one keep-alive connection; their status lines."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    statuses = []
    for _ in range(count):
        writer.write(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        statuses.append(await reader.readline())
        while await reader.readline() != b"\r\n":
            pass
        await reader.readexactly(2)  # the body, b"ok"
    writer.close()
    await writer.wait_closed()
    return statuses


def _ok(request: HttpRequest) -> HttpResponse:
    return HttpResponse(200, b"ok")


@pytest.mark.skipif(usable_cpus() < 2, reason="busy polling is off on a single CPU")
def test_the_http_server_polls_after_back_to_back_requests() -> None:
    async def main() -> None:
        server = HttpServer(_ok, 1 << 20, busy_poll_us=1_000_000)
        await server.start("127.0.0.1", 0)
        assert server.busy_poll is not None
        port = server.port
        assert await _exchange(port, 3) == [b"HTTP/1.1 200 OK\r\n"] * 3
        assert server.busy_poll.polling
        await server.stop(1.0)

    run(main)


def test_a_zero_budget_turns_busy_polling_off() -> None:
    async def main() -> None:
        server = HttpServer(_ok, 1 << 20, busy_poll_us=0)
        await server.start("127.0.0.1", 0)
        assert server.busy_poll is None
        assert await _exchange(server.port, 2) == [b"HTTP/1.1 200 OK\r\n"] * 2
        await server.stop(1.0)

    run(main)
