"""A frontend worker's end of its channel: the calls it makes of the core process.

Every call gets an id; the core's answer (messages.py) resolves the future or feeds the stream
registered under it. Abandoning a call (its future cancelled, its stream left early) tells the
core, which drops the request if it is still queued, as an in-process cancellation would.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from oceanus.core.types import InferRequest, InferResponse
from oceanus.frontends.http.protocol import HttpRequest, HttpResponse
from oceanus.frontends.workers import messages as m
from oceanus.frontends.workers.channel import Channel, Message

log = logging.getLogger("oceanus.workers")


class GrpcFailure(Exception):
    """A forwarded gRPC call ended with a status other than OK."""

    def __init__(self, code: int, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


_END = object()


class _Stream:
    """Items the core sends for one call (HTTP chunks, gRPC stream messages), then its end."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()

    async def items(self, client: CoreClient, call_id: int) -> AsyncIterator[bytes]:
        finished = False
        try:
            while True:
                item = await self.queue.get()
                if item is _END:
                    finished = True
                    return
                if isinstance(item, GrpcFailure):
                    finished = True
                    raise item
                yield item
        finally:
            client.forget(call_id, cancel=not finished)


class CoreClient:
    def __init__(self) -> None:
        # get_running_loop() costs a getpid() system call per call on Python 3.11.
        self._loop = asyncio.get_running_loop()
        self.channel: Channel | None = None
        self._ids = itertools.count(1)
        # id -> (future, request) for infer calls, a future for the other calls, or a _Stream
        self._calls: dict[int, Any] = {}
        # Server state the core mirrors to its workers.
        self.tracing = False
        self.on_drain: Callable[[], None] = lambda: None
        self.on_settings: Callable[[bytes], None] = lambda _: None
        self.on_state: Callable[[dict[str, Any]], None] = lambda _: None

    def _send(self, message: Message) -> None:
        assert self.channel is not None
        self.channel.send(message)

    def forget(self, call_id: int, cancel: bool) -> None:
        if self._calls.pop(call_id, None) is not None and cancel and self.channel is not None:
            self.channel.send((m.CANCEL, call_id))

    def _watch(self, call_id: int, future: asyncio.Future[Any]) -> None:
        def done(finished: asyncio.Future[Any]) -> None:
            if finished.cancelled():
                self.forget(call_id, cancel=True)

        future.add_done_callback(done)

    def lost(self) -> None:
        """The core process is gone: fail everything still waiting for it."""
        error = m.error_of("unavailable", "the server's core process has stopped")
        for call in self._calls.values():
            future = call[0] if isinstance(call, tuple) else call
            if isinstance(future, _Stream):
                future.queue.put_nowait(GrpcFailure(14, error.message))
            elif not future.done():
                future.set_exception(error)
        self._calls.clear()

    # ---- calls --------------------------------------------------------------------------------

    def infer(
        self, request: InferRequest, caller: str, fields: tuple[Any, ...] | None = None
    ) -> asyncio.Future[InferResponse]:
        """A decoded request; raises NeedsCore when only the core can take it as it is.
        `fields`: its messages.encode_request, when the caller made them (off the loop)."""
        if fields is None:
            fields = m.encode_request(request)
        call_id = next(self._ids)
        future: asyncio.Future[InferResponse] = self._loop.create_future()
        self._calls[call_id] = (future, request)
        self._watch(call_id, future)
        self._send((m.INFER, call_id, caller, fields))
        return future

    def http(self, request: HttpRequest) -> asyncio.Future[HttpResponse]:
        """A whole HTTP request for the core's own HTTP frontend to answer."""
        call_id = next(self._ids)
        future: asyncio.Future[HttpResponse] = self._loop.create_future()
        self._calls[call_id] = future
        self._watch(call_id, future)
        headers = list(request.headers.items())
        self._send(
            (
                m.HTTP,
                call_id,
                request.method,
                request.path,
                headers,
                request.body,
                request.too_large,
                request.begin_ns,
                request.end_ns,
            )
        )
        return future

    async def grpc_unary(self, method: str, data: bytes, metadata: list[tuple[str, str]]) -> bytes:
        """A unary call for the core's own gRPC service; raises GrpcFailure on a non-OK status."""
        call_id = next(self._ids)
        future: asyncio.Future[bytes] = self._loop.create_future()
        self._calls[call_id] = future
        self._watch(call_id, future)
        self._send((m.GRPC, call_id, method, data, metadata))
        return await future

    def grpc_stream(self, metadata: list[tuple[str, str]]) -> tuple[int, AsyncIterator[bytes]]:
        """Open a ModelStreamInfer call in the core: (id for `stream_send`, its messages)."""
        call_id = next(self._ids)
        stream = _Stream()
        self._calls[call_id] = stream
        self._send((m.STREAM_OPEN, call_id, metadata))
        return call_id, stream.items(self, call_id)

    def stream_send(self, call_id: int, data: bytes | None) -> None:
        """One message of an open stream (None: the client's last one was sent)."""
        if call_id in self._calls:
            if data is None:
                self._send((m.STREAM_END, call_id))
            else:
                self._send((m.STREAM_IN, call_id, data))

    # ---- answers ------------------------------------------------------------------------------

    def receive(self, message: Message) -> None:
        kind = message[0]
        if kind == m.STATE:
            self.tracing = bool(message[1].get("tracing", self.tracing))
            self.on_state(message[1])
            return
        if kind == m.DRAIN:
            self.on_drain()
            return
        if kind == m.SETTINGS:
            self.on_settings(message[1])
            return
        call_id = message[1]
        call = self._calls.get(call_id)
        if call is None:
            return  # cancelled meanwhile
        if kind == m.INFER_OK:
            del self._calls[call_id]
            future, request = call
            if not future.done():
                try:
                    future.set_result(m.decode_response(message[2], request))
                except Exception as exc:
                    future.set_exception(exc)
        elif kind == m.INFER_ERROR:
            del self._calls[call_id]
            if not call[0].done():
                call[0].set_exception(m.error_of(message[2], message[3]))
        elif kind == m.HTTP_RESPONSE:
            del self._calls[call_id]
            if not call.done():
                call.set_result(HttpResponse(message[2], message[4], list(message[3])))
        elif kind == m.HTTP_HEAD:
            stream = _Stream()
            self._calls[call_id] = stream
            if not call.done():
                head = HttpResponse(message[2], b"", list(message[3]))
                head.stream = stream.items(self, call_id)
                call.set_result(head)
        elif kind in (m.HTTP_CHUNK, m.STREAM_OUT):
            call.queue.put_nowait(message[2])
        elif kind == m.HTTP_DONE:
            call.queue.put_nowait(_END)
        elif kind == m.STREAM_DONE:
            code, details = message[2], message[3]
            call.queue.put_nowait(_END if code == 0 else GrpcFailure(code, details))
        elif kind == m.GRPC_OK:
            del self._calls[call_id]
            if not call.done():
                call.set_result(message[2])
        elif kind == m.GRPC_ERROR:
            del self._calls[call_id]
            if not call.done():
                call.set_exception(GrpcFailure(message[2], message[3]))
