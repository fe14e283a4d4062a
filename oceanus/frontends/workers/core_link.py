"""The core process's end of one frontend worker's channel.

Decoded inference requests go straight to `ServerCore.infer`. Everything else a worker forwards
(any HTTP request but a plain infer, any gRPC call but a plain ModelInfer, every
ModelStreamInfer message) is answered here by the ordinary in-process frontends, `HttpFrontend`
and the `GrpcService` handlers, so it behaves exactly as without workers: one implementation of
every endpoint, run where the state lives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from oceanus.core.errors import ErrorCode
from oceanus.core.server import ServerCore
from oceanus.core.types import InferResponse
from oceanus.frontends.http.app import HttpFrontend
from oceanus.frontends.http.protocol import HttpRequest, HttpResponse, Pending, Streamed
from oceanus.frontends.http.responses import error_response
from oceanus.frontends.workers import messages as m
from oceanus.frontends.workers import typed
from oceanus.ipc.aio import AioChannel
from oceanus.ipc.rings import RingReader, RingWriter

log = logging.getLogger("oceanus.workers")

# A request the core itself cancelled (the server is stopping), not its client.
CANCELLED = "request cancelled"


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class ForwardedContext:
    """What gRPC handlers use of grpc.aio's ServicerContext, for a call a worker forwarded."""

    def __init__(self, metadata: list[tuple[str, str]], write: Callable[[bytes], None]) -> None:
        self._metadata = tuple(metadata)
        self._write = write
        self._done: list[Callable[[Any], None]] = []

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise _Aborted(code, details)

    async def write(self, data: bytes) -> None:
        self._write(data)

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        self._done.append(callback)

    def finish(self) -> None:
        for callback in self._done:
            callback(self)


async def _queued(queue: asyncio.Queue[bytes | None]) -> AsyncIterator[bytes]:
    while True:
        item = await queue.get()
        if item is None:
            return
        yield item


class CoreLink:
    """Serves one worker: `receive` handles each of its messages on the core's loop."""

    def __init__(
        self,
        core: ServerCore,
        http: HttpFrontend,
        grpc_handlers: dict[str, grpc.RpcMethodHandler],
    ) -> None:
        self._core = core
        self._http = http
        self._grpc = grpc_handlers
        self.channel: AioChannel | None = None
        # The worker's rings for tensor bytes (None: inline)
        self.writer: RingWriter | None = None
        self.reader: RingReader | None = None
        # Called before a forwarded call is answered: a call that changed server state the
        # workers mirror (trace settings) then reaches every worker before its caller's answer.
        self.on_control: Callable[[], None] = lambda: None
        # The worker's Hello (it listens, or says why not): the supervisor's business.
        self.on_hello: Callable[[m.Hello], None] = lambda _: None
        # id -> what cancels it: a core future, or the task answering a forwarded call
        self._active: dict[int, asyncio.Future[Any]] = {}
        self._streams: dict[int, asyncio.Queue[bytes | None]] = {}
        self._table: dict[type, Callable[[Any], None]] = {
            m.Infer: self._infer,
            m.Hello: lambda message: self.on_hello(message),
            m.Cancel: self._cancel,
            m.Http: self._forward_http,
            m.Grpc: lambda message: self._track(message.id, self._grpc_unary(message)),
            m.StreamOpen: self._stream_open,
            m.StreamIn: lambda message: self._stream_item(message.id, message.data),
            m.StreamEnd: lambda message: self._stream_item(message.id, None),
            m.Generate: lambda message: self._track(message.id, self._generate(message)),
        }

    def _send(self, message: tuple[Any, ...]) -> None:
        if self.channel is not None:
            self.channel.send(message)

    def receive(self, message: Any) -> None:
        try:
            self._table[type(message)](message)
        except Exception:  # a bad message must never take the link down
            log.exception("frontend worker message %s failed", type(message).__name__)

    def _cancel(self, message: m.Cancel) -> None:
        future = self._active.pop(message.id, None)
        if future is not None:
            future.cancel()

    def _stream_item(self, call_id: int, data: bytes | None) -> None:
        queue = self._streams.get(call_id)
        if queue is not None:
            queue.put_nowait(data)

    def lost(self) -> None:
        """The worker is gone: whatever it asked for is of no use any more."""
        for future in self._active.values():
            future.cancel()
        self._active.clear()
        self._streams.clear()

    # ---- decoded inference ------------------------------------------------------------------

    def _infer(self, message: m.Infer) -> None:
        call_id = message.id
        block = m.Block(self.reader, message.block) if message.block is not None else None
        try:
            request = m.decode_request(message.request, block)
            request.checked = message.checked
            request.cache_key = message.cache_key
        except Exception as exc:
            self._send(m.InferError(call_id, *m.error_fields(exc)))
            return
        finally:
            if block is not None:
                block.close()  # copied out: the worker may reuse the space
        try:
            future = self._core.infer(request, message.caller)
        except Exception as exc:
            self._send(m.InferError(call_id, *m.error_fields(exc)))
            return
        if future.done():  # executed in place (a cheap model): nothing left to cancel
            self._answer(call_id, future)
            return
        self._active[call_id] = future
        future.add_done_callback(lambda done: self._infer_done(call_id, done))

    def _infer_done(self, call_id: int, future: asyncio.Future[InferResponse]) -> None:
        if self._active.pop(call_id, None) is None and future.cancelled():
            return  # the worker cancelled it: its client has gone
        self._answer(call_id, future)

    def _answer(self, call_id: int, future: asyncio.Future[InferResponse]) -> None:
        try:  # one call for the usual answer, not cancelled() + exception() + result()
            response = future.result()
        except asyncio.CancelledError:
            self._send(m.InferError(call_id, ErrorCode.UNAVAILABLE.value, CANCELLED))
            return
        except Exception as exc:
            self._send(m.InferError(call_id, *m.error_fields(exc)))
            return
        try:
            fields, block = m.encode_response(response, self.writer)
        except Exception as error:
            self._send(m.InferError(call_id, *m.error_fields(error)))
            return
        self._send(m.InferOk(call_id, fields, block))

    # ---- typed language-model requests --------------------------------------------------------

    async def _generate(self, message: m.Generate) -> None:
        """A chat or completion a worker templated and tokenized: its token ids go to the
        engine, its GenerationOutputs back (a Cancel from the worker cancels this task)."""
        call_id = message.id
        try:
            responses = self._core.infer_stream(typed.generation_request(message))
            try:
                async for response in responses:
                    if response.generation is not None:
                        self._send(m.Generated(call_id, typed.output_fields(response.generation)))
            finally:
                await responses.aclose()  # type: ignore[attr-defined]
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._send(m.InferError(call_id, *m.error_fields(exc)))
            return
        self._send(m.GenerateDone(call_id))

    # ---- forwarded HTTP ---------------------------------------------------------------------

    def _forward_http(self, message: m.Http) -> None:
        call_id = message.id
        request = HttpRequest(
            message.method,
            message.path,
            dict(message.headers),
            message.body,
            message.too_large,
            message.begin_ns,
            message.end_ns,
        )
        if log.isEnabledFor(logging.DEBUG):
            log.debug("a frontend worker forwarded HTTP %s %s", message.method, message.path)
        outcome = self._http.handle(request)
        if isinstance(outcome, HttpResponse):
            self._http_response(call_id, outcome)
        elif isinstance(outcome, Pending):
            pending = outcome
            self._active[call_id] = pending.future

            def done(future: asyncio.Future[Any]) -> None:
                if self._active.pop(call_id, None) is None and future.cancelled():
                    return  # the worker cancelled it: its client has gone
                if future.cancelled():
                    self._http_response(call_id, error_response(503, CANCELLED))
                    return
                self._http_response(call_id, pending.finish(future))

            pending.future.add_done_callback(done)
        else:
            self._track(call_id, self._stream_http(call_id, outcome))

    def _http_response(self, call_id: int, response: HttpResponse) -> None:
        self.on_control()
        now = time.monotonic_ns()
        self._send(m.HttpAnswer(call_id, response.status, response.headers, response.body))
        if response.on_sent is not None:  # traced: the core's hand-off stands for the send
            response.on_sent(now, time.monotonic_ns())

    async def _stream_http(self, call_id: int, outcome: Streamed) -> None:
        parts = outcome.parts
        try:
            async for part in parts:
                if isinstance(part, HttpResponse):
                    self._send(m.HttpHead(call_id, part.status, part.headers))
                else:
                    self._send(m.HttpChunk(call_id, part))
        finally:
            aclose = getattr(parts, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
        self._send(m.HttpDone(call_id))

    # ---- forwarded gRPC ---------------------------------------------------------------------

    async def _grpc_unary(self, message: m.Grpc) -> None:
        call_id, method, data = message.id, message.method, message.data
        handler = self._grpc.get(method)
        context = ForwardedContext(message.metadata, lambda _: None)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("a frontend worker forwarded gRPC %s", method)
        if handler is None or handler.unary_unary is None:
            self._send(m.GrpcError(call_id, grpc.StatusCode.UNIMPLEMENTED.value[0], ""))
            return
        try:
            request = handler.request_deserializer(data) if handler.request_deserializer else data
            response = await handler.unary_unary(request, context)
            self.on_control()
            serialize = handler.response_serializer
            self._send(m.GrpcOk(call_id, serialize(response) if serialize else response))
        except _Aborted as exc:
            self._send(m.GrpcError(call_id, exc.code.value[0], exc.details))
        except Exception as exc:
            log.exception("forwarded %s failed", method)
            details = f"internal error: {type(exc).__name__}: {exc}"
            self._send(m.GrpcError(call_id, grpc.StatusCode.INTERNAL.value[0], details))
        finally:
            context.finish()

    def _stream_open(self, message: m.StreamOpen) -> None:
        call_id = message.id
        handler = self._grpc.get("ModelStreamInfer")
        assert handler is not None and handler.stream_stream is not None
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._streams[call_id] = queue
        context = ForwardedContext(
            message.metadata, lambda data: self._send(m.StreamOut(call_id, data))
        )

        async def serve() -> None:
            code, details = 0, ""
            try:
                await handler.stream_stream(_queued(queue), context)
            except _Aborted as exc:
                code, details = exc.code.value[0], exc.details
            finally:
                self._streams.pop(call_id, None)
            self._send(m.StreamDone(call_id, code, details))

        self._track(call_id, serve())

    def _track(self, call_id: int, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._active[call_id] = task
        task.add_done_callback(lambda _: self._active.pop(call_id, None))
