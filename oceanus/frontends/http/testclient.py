"""An in-process client for the HTTP frontend, as Starlette's TestClient is for Starlette.

It calls the frontend's own seam, `HttpFrontend.handle(HttpRequest) -> Outcome`, and completes
the outcome as the protocol does (a `Pending` future finished by its `finish`, a `Streamed` or
`stream` body gathered whole), with no socket and no parser. What it proves is the HTTP rules
above the protocol: routing, statuses, error texts, JSON and binary codecs, headers the
frontend sets. What only a socket shows (framing, limits the parser enforces, keep-alive,
pipelining, chunked transfer, disconnects) stays with the wire tests.

    with running_core([repository]) as core:   # the test's own helper
        client = HttpTestClient(HttpFrontend(core), loop)
        reply = client.post("/v2/models/simple/infer", body)
        assert reply.status == 200 and reply.json()["outputs"]

The client is synchronous (it runs its coroutine on the loop the core runs on, which must not
be running); `arequest` is the same call for tests that are coroutines themselves.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import orjson

from oceanus.frontends.http.app import HttpFrontend
from oceanus.frontends.http.protocol import HttpRequest, HttpResponse, Pending, Streamed


@dataclass(frozen=True)
class Reply:
    """A response as a client reads it: status, headers (lower-case names), the whole body."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


class HttpTestClient:
    """Sends requests to `frontend.handle` on `loop` (the loop its core runs on)."""

    def __init__(self, frontend: HttpFrontend, loop: asyncio.AbstractEventLoop) -> None:
        self.frontend = frontend
        self.loop = loop

    def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> Reply:
        return self.loop.run_until_complete(self.arequest(method, path, body, headers))

    def get(self, path: str, headers: dict[str, str] | None = None) -> Reply:
        return self.request("GET", path, b"", headers)

    def post(self, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> Reply:
        return self.request("POST", path, body, headers)

    async def arequest(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> Reply:
        given = [
            (name.encode("latin-1"), value.encode("latin-1"))
            for name, value in (headers or {}).items()
        ]
        # As the protocol builds it: lower-case names (the last of a repeated one wins), the
        # names as written kept where they differ, the query string cut off.
        lowered = {name.lower(): value for name, value in given}
        names = {name.lower(): name for name, _ in given if name.lower() != name}
        now = time.monotonic_ns()
        request = HttpRequest(
            method, path.split("?", 1)[0], lowered, body, False, now, now, names or None
        )
        outcome = self.frontend.handle(request)
        if isinstance(outcome, Pending):
            await asyncio.wait([outcome.future])
            outcome = outcome.finish(outcome.future)
        if isinstance(outcome, Streamed):
            return await _gather(outcome)
        if outcome.stream is not None:
            chunks = [chunk async for chunk in outcome.stream]
            return _reply(outcome, b"".join(chunks))
        if outcome.on_sent is not None:
            sent = time.monotonic_ns()
            outcome.on_sent(sent, sent)
        return _reply(outcome, bytes(outcome.body))


async def _gather(outcome: Streamed) -> Reply:
    head: HttpResponse | None = None
    chunks: list[bytes] = []
    async for part in outcome.parts:
        if isinstance(part, HttpResponse):
            head = part
        else:
            chunks.append(part)
    assert head is not None, "a streamed outcome yields its head first"
    return _reply(head, b"".join(chunks))


def _reply(response: HttpResponse, body: bytes) -> Reply:
    headers = {
        name.decode("latin-1").lower(): value.decode("latin-1") for name, value in response.headers
    }
    return Reply(response.status, headers, body)
