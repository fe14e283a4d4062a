"""A frontend worker's end of its channel: the calls it makes of the core process.

Every call gets an id; the core's answer (messages.py) resolves the future or feeds the stream
registered under it. Abandoning a call (its future cancelled, its stream left early) tells the
core, which drops the request if it is still queued, as an in-process cancellation would.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from oceanus.core.types import InferRequest, InferResponse
from oceanus.frontends.http.protocol import HttpRequest, HttpResponse
from oceanus.frontends.workers import messages as m
from oceanus.frontends.workers import typed
from oceanus.frontends.workers.mirror import Mirror
from oceanus.ipc.aio import AioChannel
from oceanus.ipc.rings import RingReader, RingWriter

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

    async def items(self, client: CoreClient, call_id: int) -> AsyncGenerator[Any, None]:
        """The items until the end; an exception put in the queue (a gRPC status, a Generate
        call's error) is raised. Leaving early cancels the call in the core."""
        finished = False
        try:
            while True:
                item = await self.queue.get()
                if item is _END:
                    finished = True
                    return
                if isinstance(item, Exception):
                    finished = True
                    raise item
                yield item
        finally:
            client.forget(call_id, cancel=not finished)


class CoreClient:
    def __init__(self) -> None:
        # get_running_loop() costs a getpid() system call per call on Python 3.11.
        self._loop = asyncio.get_running_loop()
        self.channel: AioChannel | None = None
        # The worker's rings for tensor bytes (None: inline, /dev/shm had no room for them)
        self.writer: RingWriter | None = None
        self.reader: RingReader | None = None
        self._ids = itertools.count(1)
        # id -> (future, request) for infer calls, a future for the other calls, or a _Stream
        self._calls: dict[int, Any] = {}
        # Server state the core mirrors to its workers.
        self.tracing = False
        self.mirror = Mirror()  # the loaded versions' configs, to validate requests here
        self.on_drain: Callable[[], None] = lambda: None
        self.on_settings: Callable[[bytes], None] = lambda _: None
        self.on_state: Callable[[dict[str, Any]], None] = lambda _: None
        self._table: dict[type, Callable[[Any], None]] = {
            m.InferOk: self._infer_ok,
            m.InferError: self._infer_error,
            m.HttpAnswer: self._http_answer,
            m.HttpHead: self._http_head,
            m.HttpChunk: self._item,
            m.StreamOut: self._item,
            m.HttpDone: self._http_done,
            m.StreamDone: self._stream_done,
            m.GrpcOk: self._grpc_ok,
            m.GrpcError: self._grpc_error,
            m.State: self._state,
            m.Drain: lambda _: self.on_drain(),
            m.Settings: lambda message: self.on_settings(message.blob),
            m.Generated: lambda message: self._item_as(message.id, message.output),
            m.GenerateDone: lambda message: self._item_as(message.id, _END),
        }

    def _send(self, message: tuple[Any, ...]) -> None:
        assert self.channel is not None
        self.channel.send(message)

    def forget(self, call_id: int, cancel: bool) -> None:
        if self._calls.pop(call_id, None) is not None and cancel and self.channel is not None:
            self.channel.send(m.Cancel(call_id))

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
        fields, block = m.place_request(fields, self.writer)
        serial, cache_key = self.mirror.check(request)
        self._send(m.Infer(call_id, caller, fields, block, serial, cache_key))
        return future

    def http(self, request: HttpRequest) -> asyncio.Future[HttpResponse]:
        """A whole HTTP request for the core's own HTTP frontend to answer."""
        call_id = next(self._ids)
        future: asyncio.Future[HttpResponse] = self._loop.create_future()
        self._calls[call_id] = future
        self._watch(call_id, future)
        headers = list(request.headers.items())
        self._send(
            m.Http(
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
        self._send(m.Grpc(call_id, method, data, metadata))
        return await future

    def grpc_stream(self, metadata: list[tuple[str, str]]) -> tuple[int, AsyncIterator[bytes]]:
        """Open a ModelStreamInfer call in the core: (id for `stream_send`, its messages)."""
        call_id = next(self._ids)
        stream = _Stream()
        self._calls[call_id] = stream
        self._send(m.StreamOpen(call_id, metadata))
        return call_id, stream.items(self, call_id)

    def stream_send(self, call_id: int, data: bytes | None) -> None:
        """One message of an open stream (None: the client's last one was sent)."""
        if call_id in self._calls:
            if data is None:
                self._send(m.StreamEnd(call_id))
            else:
                self._send(m.StreamIn(call_id, data))

    def generate(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """A typed language-model request (`request.generation`, planned in this worker) for
        the core's engine; its responses as they come. Leaving early cancels it."""
        call_id = next(self._ids)
        stream = _Stream()
        self._calls[call_id] = stream
        self._send(typed.generate_message(call_id, request))
        return self._generated(call_id, stream, request)

    async def _generated(
        self, call_id: int, stream: _Stream, request: InferRequest
    ) -> AsyncIterator[InferResponse]:
        # aclosing: a reader leaving early closes the inner items at once (its cancel), not
        # whenever the event loop finalizes it.
        async with contextlib.aclosing(stream.items(self, call_id)) as items:
            async for item in items:
                output = typed.output_of(item)
                yield InferResponse(request.model_name, "", request.id, [], generation=output)

    # ---- answers ------------------------------------------------------------------------------

    def receive(self, message: Any) -> None:
        handler = self._table.get(type(message))
        if handler is not None:
            handler(message)

    def _state(self, message: m.State) -> None:
        self.tracing = bool(message.values.get("tracing", self.tracing))
        models = message.values.get("models")
        if models is not None:
            self.mirror.update(models)
        generating = message.values.get("generating")
        if generating is not None:
            self.mirror.update_generating(generating)
        self.on_state(message.values)

    def _infer_ok(self, message: m.InferOk) -> None:
        block = m.Block(self.reader, message.block) if message.block is not None else None
        try:
            call = self._calls.pop(message.id, None)
            if call is None:
                return  # cancelled meanwhile
            future, request = call
            if not future.done():
                try:
                    future.set_result(m.decode_response(message.response, request, block))
                except Exception as exc:
                    future.set_exception(exc)
        finally:
            if block is not None:
                block.close()

    def _infer_error(self, message: m.InferError) -> None:
        call = self._calls.pop(message.id, None)
        if isinstance(call, _Stream):  # a Generate call's end
            self._calls[message.id] = call  # forgotten by its reader
            call.queue.put_nowait(m.error_of(message.code, message.message))
        elif call is not None and not call[0].done():
            call[0].set_exception(m.error_of(message.code, message.message))

    def _http_answer(self, message: m.HttpAnswer) -> None:
        call = self._calls.pop(message.id, None)
        if call is not None and not call.done():
            call.set_result(HttpResponse(message.status, message.body, list(message.headers)))

    def _http_head(self, message: m.HttpHead) -> None:
        call = self._calls.get(message.id)
        if call is None:
            return
        stream = _Stream()
        self._calls[message.id] = stream
        if not call.done():
            head = HttpResponse(message.status, b"", list(message.headers))
            head.stream = stream.items(self, message.id)
            call.set_result(head)

    def _item_as(self, call_id: int, item: Any) -> None:
        call = self._calls.get(call_id)
        if call is not None:
            call.queue.put_nowait(item)

    def _item(self, message: m.HttpChunk | m.StreamOut) -> None:
        call = self._calls.get(message.id)
        if call is not None:
            call.queue.put_nowait(message.data)

    def _http_done(self, message: m.HttpDone) -> None:
        call = self._calls.get(message.id)
        if call is not None:
            call.queue.put_nowait(_END)

    def _stream_done(self, message: m.StreamDone) -> None:
        call = self._calls.get(message.id)
        if call is not None:
            end = _END if message.code == 0 else GrpcFailure(message.code, message.details)
            call.queue.put_nowait(end)

    def _grpc_ok(self, message: m.GrpcOk) -> None:
        call = self._calls.pop(message.id, None)
        if call is not None and not call.done():
            call.set_result(message.data)

    def _grpc_error(self, message: m.GrpcError) -> None:
        call = self._calls.pop(message.id, None)
        if call is not None and not call.done():
            call.set_exception(GrpcFailure(message.code, message.details))
