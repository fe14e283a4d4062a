"""The KServe v2 HTTP routes of an in-process server, called without a socket: what a host that
owns the HTTP connection (Ray Serve's proxy, an ASGI application) hands its requests to. It is
the HTTP frontend's own request handler, so routes, status codes and bodies are the HTTP
frontend's, byte for byte; only the connection is someone else's."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from oceanus.embedded.server import Server
from oceanus.frontends.http.app import HttpFrontend
from oceanus.frontends.http.protocol import HttpRequest, HttpResponse, Pending, Streamed
from oceanus.parts import http_frontend

# (status, headers, body) of one answer.
Answer = tuple[int, list[tuple[bytes, bytes]], bytes]


class HttpHandler:
    """`await handler(method, path, headers, body)` -> (status, headers, body)."""

    def __init__(self, server: Server) -> None:
        settings = server.settings
        self._server = server
        self._frontend = http_frontend(settings, server._require_started())

    async def __call__(
        self, method: str, path: str, headers: dict[bytes, bytes], body: bytes
    ) -> Answer:
        now = time.monotonic_ns()
        request = HttpRequest(method, path, headers, body, begin_ns=now, end_ns=now)
        loop = asyncio.get_running_loop()
        caller = threading.get_ident()
        answer: asyncio.Future[Answer] = loop.create_future()

        def deliver(result: Answer | BaseException) -> None:
            def settle() -> None:
                if answer.done():
                    return
                if isinstance(result, BaseException):
                    answer.set_exception(result)
                else:
                    answer.set_result(result)

            if threading.get_ident() == caller:
                settle()
            else:
                loop.call_soon_threadsafe(settle)

        # On this thread while the core's loop is idle (no wake-up), else on the loop thread.
        self._server._loop_thread().try_call(_serve, self._frontend, request, deliver)
        return await answer


def _serve(frontend: HttpFrontend, request: HttpRequest, deliver: Callable[[Any], None]) -> None:
    """On the core's loop: answer now, when the pending future completes, or when the
    streamed parts are all there (they are gathered into one body)."""
    outcome = frontend.handle(request)
    if isinstance(outcome, HttpResponse):
        _answer(outcome, deliver)
    elif isinstance(outcome, Streamed):
        task = asyncio.ensure_future(_gather(outcome))
        task.add_done_callback(lambda done: deliver(_result(done)))
    elif isinstance(outcome, Pending):
        pending = outcome

        def finish(future: asyncio.Future[Any]) -> None:
            try:
                _answer(pending.finish(future), deliver)
            except Exception as exc:
                deliver(exc)

        if pending.future.done():
            finish(pending.future)
        else:
            pending.future.add_done_callback(finish)


def _answer(response: HttpResponse, deliver: Callable[[Any], None]) -> None:
    if response.stream is not None:
        task = asyncio.ensure_future(_gather(Streamed(_parts(response))))
        task.add_done_callback(lambda done: deliver(_result(done)))
        return
    deliver((response.status, list(response.headers), bytes(response.body)))


async def _parts(response: HttpResponse) -> Any:
    yield response
    assert response.stream is not None
    async for chunk in response.stream:
        yield chunk


async def _gather(outcome: Streamed) -> Answer:
    head: HttpResponse | None = None
    chunks: list[bytes] = []
    async for part in outcome.parts:
        if head is None:
            assert isinstance(part, HttpResponse)
            head = part
        else:
            assert isinstance(part, bytes)
            chunks.append(part)
    assert head is not None
    return head.status, list(head.headers), b"".join(chunks)


def _result(task: asyncio.Future[Answer]) -> Answer | BaseException:
    if task.cancelled():
        return asyncio.CancelledError()
    error = task.exception()
    return error if error is not None else task.result()
