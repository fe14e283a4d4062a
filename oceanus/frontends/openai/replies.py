"""How the OpenAI-compatible routes (and the Anthropic and Responses ones beside them) reply:
a JSON document, a document computed later, or a stream of server-sent events whose head waits
for the first event, so that a request refused before its first token gets an ordinary error
reply instead of a 200 with an error event. Each API writes failures in its own shape.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from typing import Any, Protocol

import orjson

from oceanus.frontends.http.protocol import HttpResponse, Pending
from oceanus.frontends.openai import generation
from oceanus.frontends.openai.errors import JSON, as_openai_error

EVENT_STREAM = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]


def json_reply(document: Any, status: int = 200) -> HttpResponse:
    return HttpResponse(status, orjson.dumps(document), [(b"content-type", JSON)])


class ErrorShape(Protocol):
    """How an API writes a failure: as the reply, and as an event once its stream began."""

    def reply(self, exc: BaseException) -> HttpResponse: ...

    def event(self, exc: BaseException) -> bytes: ...


class _OpenAIShape:
    def reply(self, exc: BaseException) -> HttpResponse:
        return as_openai_error(exc).response()

    def event(self, exc: BaseException) -> bytes:
        return generation.event(as_openai_error(exc).document()) + generation.DONE_EVENT


OPENAI_SHAPE = _OpenAIShape()


async def stream_reply(
    events: AsyncGenerator[bytes, None], shape: ErrorShape
) -> AsyncIterator[HttpResponse | bytes]:
    """A streaming reply: the head once the first event is ready (a request refused before,
    by the plan or the engine's first step, is an ordinary error reply), then the events. A
    failure mid-stream is the API's error event."""
    try:
        first = await anext(events)
    except Exception as exc:
        await events.aclose()
        error = shape.reply(exc)
        yield HttpResponse(error.status, headers=error.headers)
        yield bytes(error.body)
        return
    yield HttpResponse(200, headers=list(EVENT_STREAM))
    try:
        yield first
        async for part in events:
            yield part
    except Exception as exc:
        yield shape.event(exc)
    finally:
        await events.aclose()


def pending(work: Awaitable[Any], shape: ErrorShape) -> Pending:
    """A reply computed later (a JSON document), failures in the API's shape."""

    def finish(future: asyncio.Future[Any]) -> HttpResponse:
        exc = future.exception()
        return shape.reply(exc) if exc is not None else json_reply(future.result())

    return Pending(asyncio.ensure_future(_awaited(work)), finish)


async def _awaited(work: Awaitable[Any]) -> Any:
    return await work
