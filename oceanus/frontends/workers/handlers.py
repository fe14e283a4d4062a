"""What a frontend worker answers itself, and what it hands to the core process.

The hot path stays in the worker: a plain inference request (HTTP `POST .../infer`, gRPC
`ModelInfer`) is parsed and decoded here with the in-process frontends' own functions, travels to
the core as a decoded request, and its response is encoded here. Every other request, and any
inference request the worker cannot decode to the very request the core would have decoded (one
that names shared memory, a traced one, a malformed one), goes to the core whole and is answered
there by the in-process frontend, with the in-process frontend's answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from oceanus.core.errors import InferenceServerError
from oceanus.core.shared_memory import Region, SharedMemoryManager, ShmTarget
from oceanus.core.types import InferRequest
from oceanus.frontends.grpc import health
from oceanus.frontends.grpc import responses as grpc_responses
from oceanus.frontends.grpc.errors import grpc_status
from oceanus.frontends.grpc.methods import SERVICE_NAME, UNARY_METHODS, Context, restricted
from oceanus.frontends.grpc.prepare import prepare
from oceanus.frontends.header_forward import HeaderForward
from oceanus.frontends.http.app import check_restriction
from oceanus.frontends.http.infer import (
    HTTP_CALLER,
    Finisher,
    decode_infer,
    decode_on_loop,
    infer_route,
)
from oceanus.frontends.http.protocol import HttpRequest, HttpResponse, Pending, Streamed
from oceanus.frontends.workers.client import CoreClient, GrpcFailure
from oceanus.frontends.workers.messages import NeedsCore, encode_request

log = logging.getLogger("oceanus.workers")

_STATUS = {code.value[0]: code for code in grpc.StatusCode}
GRPC_CALLER = "ModelInfer RPC"


class _CoreRegions(SharedMemoryManager):
    """Shared memory as a worker sees it: every region lives in the core process, so a request
    that names one is the core's to decode."""

    def input_view(self, name: str, offset: int, byte_size: int, uses: list[Region]) -> memoryview:
        raise NeedsCore

    def output_target(
        self, name: str, offset: int, byte_size: int, uses: list[Region]
    ) -> ShmTarget:
        raise NeedsCore


CORE_REGIONS = _CoreRegions()


def _as_is(future: asyncio.Future[Any]) -> HttpResponse:
    response: HttpResponse = future.result()
    return response


class WorkerHttp:
    """The worker's HTTP handler (`handle` is the protocol's handler)."""

    def __init__(
        self,
        client: CoreClient,
        max_input_size: int,
        restrictions: dict[str, tuple[str, str]] | None = None,
        header_forward: str = "",
        openai: Callable[[HttpRequest], HttpResponse | Pending | Streamed] | None = None,
    ) -> None:
        self._client = client
        self._max_input_size = max_input_size
        # The OpenAI routes (openai_routes.py): chats and completions for the built-in engine
        # are templated and tokenized here; the rest goes to the core whole.
        self._openai = openai
        self._header_forward = HeaderForward(header_forward)
        self._restrictions = {
            category: (header.encode("latin-1"), value.encode("latin-1"))
            for category, (header, value) in (restrictions or {}).items()
        }

    def handle(self, request: HttpRequest) -> HttpResponse | Pending | Streamed:
        if self._openai is not None and request.path.startswith("/v1/"):
            return self._openai(request)
        route = infer_route(request)
        if route is not None and not self._client.tracing:
            try:
                if self._restrictions:
                    check_restriction(self._restrictions, request, request.path.split("/")[2:])
                if not decode_on_loop(request):  # as the in-process frontend decides
                    later = self._infer_later(request, route[0], route[1])
                    return Pending(asyncio.ensure_future(later), _as_is)
                infer_request, finisher = decode_infer(
                    request, route[0], route[1], CORE_REGIONS, self._max_input_size
                )
                if self._header_forward:
                    self._header_forward.apply(request.header_items(), infer_request.parameters)
                return Pending(self._client.infer(infer_request, HTTP_CALLER), finisher)
            except Exception:  # NeedsCore, or a mistake the core answers in its own words
                pass
        return Pending(self._client.http(request), _as_is)

    async def _infer_later(self, request: HttpRequest, name: str, version: str) -> HttpResponse:
        """A big body, decoded on a thread; what the worker cannot take goes to the core."""
        future: asyncio.Future[Any]
        finisher: Finisher

        def decode() -> tuple[InferRequest, Finisher, tuple[Any, ...]]:
            infer_request, finisher = decode_infer(
                request, name, version, CORE_REGIONS, self._max_input_size
            )
            if self._header_forward:
                self._header_forward.apply(request.header_items(), infer_request.parameters)
            return infer_request, finisher, encode_request(infer_request)

        try:
            infer_request, finisher, fields = await asyncio.to_thread(decode)
            future = self._client.infer(infer_request, HTTP_CALLER, fields)
        except Exception:  # NeedsCore, or a mistake the core answers in its own words
            future, finisher = self._client.http(request), _as_is
        try:
            await asyncio.wait((future,))
        except asyncio.CancelledError:
            future.cancel()  # the client left: so does the request
            raise
        return finisher(future)


def _metadata(context: Context) -> list[tuple[str, Any]]:
    return [(key, value) for key, value in context.invocation_metadata() or ()]


class WorkerGrpc:
    """The worker's gRPC handlers: ModelInfer decoded here, everything else by the core."""

    def __init__(
        self,
        client: CoreClient,
        restrictions: dict[str, tuple[str, str]] | None = None,
        header_forward: str = "",
    ) -> None:
        self._client = client
        self._restrictions = restrictions or {}
        self._header_forward = HeaderForward(header_forward)
        # Set on shutdown: open streams stop taking requests, answer the ones they have, end.
        self.draining = asyncio.Event()

    def _forwarding(self, method: str) -> Callable[[bytes, Context], Awaitable[bytes]]:
        client = self._client

        async def forward(data: bytes, context: Context) -> bytes:
            try:
                return await client.grpc_unary(method, data, _metadata(context))
            except GrpcFailure as failure:
                await context.abort(_STATUS[failure.code], failure.details)
                raise AssertionError("unreachable") from None  # abort raises

        return forward

    async def model_infer(self, data: bytes, context: Context) -> bytes:
        client = self._client
        if not client.tracing:
            try:
                # the in-process frontend's bounds: heavy parsing and decoding off the loop
                # (the transport inflated a large compressed message off it already)
                _, decoded = await prepare(data, CORE_REGIONS)
                if isinstance(decoded, InferenceServerError):
                    raise decoded  # the core answers it, in Triton's order and words
                request = decoded
                if self._header_forward:
                    self._header_forward.apply(_metadata(context), request.parameters)
                future = client.infer(request, GRPC_CALLER)
            except Exception:  # NeedsCore, or a mistake the core answers in its own words
                future = None
            if future is not None:
                try:
                    return grpc_responses.encode_infer_response(await future)
                except InferenceServerError as exc:
                    await context.abort(grpc_status(exc.code), exc.message)
        return await self._forwarding("ModelInfer")(data, context)

    async def model_stream_infer(self, requests: AsyncIterator[bytes], context: Context) -> None:
        """A stream is served by the core's stream handler; the worker relays both ways."""
        client = self._client
        call_id, responses = client.grpc_stream(_metadata(context))

        async def pump() -> None:
            async for data in requests:
                client.stream_send(call_id, data)

        async def pump_until_draining() -> None:
            reading = asyncio.ensure_future(pump())
            draining = asyncio.ensure_future(self.draining.wait())
            try:
                await asyncio.wait([reading, draining], return_when=asyncio.FIRST_COMPLETED)
            finally:
                reading.cancel()
                draining.cancel()
            client.stream_send(call_id, None)  # the core answers what it has, then ends

        pumping = asyncio.ensure_future(pump_until_draining())
        try:
            async for data in responses:
                await context.write(data)
        except GrpcFailure as failure:
            await context.abort(_STATUS[failure.code], failure.details)
        finally:
            if not pumping.done():
                pumping.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pumping

    def method_handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        rules = self._restrictions
        handlers = {
            method: grpc.unary_unary_rpc_method_handler(self._forwarding(method))
            for method, *_ in UNARY_METHODS
        }
        handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(
            restricted(rules, "inference", self.model_infer)
        )
        handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
            self.model_stream_infer
        )
        return handlers

    def health_handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        return {"Check": grpc.unary_unary_rpc_method_handler(self._forwarding("Check"))}

    def generic_handlers(self) -> tuple[Any, ...]:
        return (
            grpc.method_handlers_generic_handler(SERVICE_NAME, self.method_handlers()),
            grpc.method_handlers_generic_handler(health.SERVICE_NAME, self.health_handlers()),
        )
