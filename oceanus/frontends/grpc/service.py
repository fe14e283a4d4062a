"""`inference.GRPCInferenceService` and `grpc.health.v1.Health` over the core, as
`grpc.RpcMethodHandler`s: served by our HTTP/2 transport (frontends/grpc_transport/), or by
grpc.aio when OCEANUS_GRPC_TRANSPORT=grpcio; the handlers cannot tell which.

Every RPC calls the same core methods the HTTP frontend calls; this module only turns protobuf
messages into those calls and back, and core errors into gRPC statuses (errors.py). The
repository, shared memory, trace and log settings RPCs are admin.py's (`AdminRpcs`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, TypeAlias

import grpc
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb

from oceanus.core.errors import InferenceServerError, unsupported
from oceanus.core.observability.tracing import Trace
from oceanus.core.server import DECOUPLED_UNSUPPORTED, ServerCore
from oceanus.core.types import InferRequest, InferResponse
from oceanus.frontends.grpc import codec, health
from oceanus.frontends.grpc import responses as response_codec
from oceanus.frontends.grpc.admin import AdminRpcs
from oceanus.frontends.grpc.errors import failure_status
from oceanus.frontends.grpc.methods import UNARY_METHODS, Context, restricted, unary_handler
from oceanus.frontends.grpc.prepare import FEW_BYTES, Prepared, decode_parsed, prepare
from oceanus.frontends.header_forward import HeaderForward
from oceanus.logs import LogSettings

log = logging.getLogger("oceanus.grpc")


# A stream's response, or None for its end; a traced one comes with its Trace (finished once
# written).
Item: TypeAlias = "bytes | tuple[bytes, Trace] | None"


class Outbox:
    """A stream's responses in order: what it uses of asyncio.Queue (`put_nowait`, `get`),
    with one deque instead of a Queue's four and its Event (each open stream held ~1 KB of
    them; ~1,000 held streams left the RSS 10 % up, docs/reliability.md)."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: collections.deque[Item] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: Item) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> Item:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()


async def _relay(
    request: InferRequest,
    responses: AsyncIterator[InferResponse],
    outbox: Outbox,
) -> None:
    """A decoupled model's responses to one stream request, in order; an error ends them."""
    try:
        async for response in responses:
            outbox.put_nowait(response_codec.encode_stream_response(response, marked=True))
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        _, text = failure_status(exc, "ModelStreamInfer")
        outbox.put_nowait(
            response_codec.encode_stream_error(
                text, request.id, request.model_name, request.model_version, final=True
            )
        )


class GrpcService(AdminRpcs):
    """The RPC handlers (the administrative ones inherited from admin.py); `method_handlers()`
    gives them to server.py's server, either transport."""

    def __init__(
        self,
        core: ServerCore,
        restrictions: dict[str, tuple[str, str]] | None = None,
        log_settings: LogSettings | None = None,
        header_forward: str = "",
    ) -> None:
        self.core = core
        self.restrictions = restrictions or {}
        # --grpc-header-forward-pattern
        self.header_forward = HeaderForward(header_forward)
        self.log_settings = log_settings  # the server's live settings; None: LogSettings is off
        # Set on shutdown: open streams answer what they have received, then end.
        self.draining = asyncio.Event()
        self._drain_wait: asyncio.Future[Any] | None = None

    # ---- health and metadata ----------------------------------------------------------------

    def server_live(self, request: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.core.live)

    def server_ready(self, request: pb.ServerReadyRequest) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.core.ready())

    def health_check(self, request: Any) -> Any:
        status = health.SERVING if self.core.ready() else health.NOT_SERVING
        return health.HealthCheckResponse(status=status)

    def model_ready(self, request: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
        codec.check_version(request.version)
        return pb.ModelReadyResponse(ready=self.core.model_ready(request.name, request.version))

    def server_metadata(self, request: pb.ServerMetadataRequest) -> pb.ServerMetadataResponse:
        metadata = self.core.metadata()
        return pb.ServerMetadataResponse(
            name=metadata["name"], version=metadata["version"], extensions=metadata["extensions"]
        )

    def model_metadata(self, request: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
        codec.check_version(request.version)
        metadata = self.core.model_metadata(request.name, request.version)
        return json_format.ParseDict(
            metadata, pb.ModelMetadataResponse(), ignore_unknown_fields=True
        )

    def model_config(self, request: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
        codec.check_version(request.version)
        response = pb.ModelConfigResponse()
        response.config.CopyFrom(self.core.model_config(request.name, request.version))
        return response

    def model_statistics(self, request: pb.ModelStatisticsRequest) -> pb.ModelStatisticsResponse:
        codec.check_version(request.version)
        stats = self.core.statistics(request.name, request.version)
        return json_format.ParseDict(
            {"model_stats": stats}, pb.ModelStatisticsResponse(), ignore_unknown_fields=True
        )

    # ---- inference --------------------------------------------------------------------------

    async def model_infer(self, data: bytes, context: Context) -> bytes:
        """ModelInfer: the hot path. Takes and returns message bytes (see codec.py).

        If the client cancels, the transport cancels this task, which cancels the core's future: a
        request still queued leaves the queue.
        """
        try:
            if len(data) < FEW_BYTES:  # the common case, without a coroutine
                message, raw = codec.parse_infer_request(data)
                decoded = decode_parsed(message, raw, self.core.shared_memory)
            else:
                message, decoded = await prepare(data, self.core.shared_memory)
            if isinstance(decoded, InferenceServerError):
                # the message parsed once: a large one is never parsed again on the loop
                self._check_model(message, "ModelInfer RPC")
                raise decoded
            request = decoded
            if self.header_forward:
                self.header_forward.apply(context.invocation_metadata() or (), request.parameters)
            if self.core.tracer.active:
                return await self._traced_infer(request, context)
            response = await self.core.infer(request, caller="ModelInfer RPC")
            return response_codec.encode_infer_response(response)
        except Exception as exc:
            code, message = failure_status(exc, "ModelInfer")
        await context.abort(code, message)
        raise AssertionError("unreachable")  # abort raises

    def _check_model(self, message: pb.ModelInferRequest, caller: str | None) -> None:
        """Triton's order for a request it cannot decode: the version string, then the model
        (unknown, or decoupled for `caller`), then the request. Called only when decoding
        failed, so a good request looks its model up once."""
        codec.check_version(message.model_version)
        decoupled = self.core.is_decoupled(message.model_name, message.model_version)
        if decoupled and caller is not None:
            raise unsupported(DECOUPLED_UNSUPPORTED.format(caller=caller))

    async def _traced_infer(self, request: InferRequest, context: Context) -> bytes:
        """ModelInfer for a request that may be traced: the handler's start stands for
        GRPC_WAITREAD_START/END (the transport has read the message by then); GRPC_SEND_END is
        when the call completes."""
        tracer = self.core.tracer
        traceparent = None
        if tracer.propagates_context:
            metadata = dict(context.invocation_metadata() or ())
            traceparent = metadata.get("traceparent")
        trace = tracer.sample(request.model_name, traceparent)
        if trace is None:
            response = await self.core.infer(request, caller="ModelInfer RPC")
            return response_codec.encode_infer_response(response)
        trace.capture("GRPC_WAITREAD_START", request.received_ns)
        trace.capture("GRPC_WAITREAD_END", request.received_ns)
        request.trace = trace

        def sent(_: Any) -> None:
            trace.capture("GRPC_SEND_END", time.monotonic_ns())
            trace.finish()

        context.add_done_callback(sent)
        try:
            response = await self.core.infer(request, caller="ModelInfer RPC")
            return response_codec.encode_infer_response(response)
        finally:
            trace.capture("GRPC_SEND_START", time.monotonic_ns())

    async def model_stream_infer(self, requests: AsyncIterator[bytes], context: Context) -> None:
        """ModelStreamInfer: any number of requests; each response (or error) is written as soon
        as it is ready, carrying its request's id. Errors never end the stream."""
        outbox = Outbox()
        pending: set[asyncio.Future[Any]] = set()
        writer = asyncio.ensure_future(_write_all(outbox, context))
        metadata = list(context.invocation_metadata() or ()) if self.header_forward else []
        reader = asyncio.ensure_future(self._read_stream(requests, outbox, pending, metadata))
        try:
            await asyncio.wait([reader, self._drain()], return_when=asyncio.FIRST_COMPLETED)
            if reader.done():
                reader.result()
            while pending:
                await asyncio.wait(list(pending))
            outbox.put_nowait(None)
            await writer
        finally:
            for future in (*pending, reader):
                future.cancel()
            if not writer.done():
                writer.cancel()

    def _drain(self) -> asyncio.Future[Any]:
        """One wait on `draining` for all streams (a task each was memory per open stream)."""
        if self._drain_wait is None:
            self._drain_wait = asyncio.ensure_future(self.draining.wait())
        return self._drain_wait

    async def _read_stream(
        self,
        requests: AsyncIterator[bytes],
        outbox: Outbox,
        pending: set[asyncio.Future[Any]],
        metadata: list[tuple[str, Any]],
    ) -> None:
        async for data in requests:
            try:
                prepared: Prepared | Exception = await prepare(data, self.core.shared_memory)
            except Exception as exc:  # a message that does not parse: answered in order
                prepared = exc
            self._stream_request(prepared, outbox, pending, metadata)

    def _stream_request(
        self,
        prepared: Prepared | Exception,
        outbox: Outbox,
        pending: set[asyncio.Future[Any]],
        metadata: list[tuple[str, Any]] | None = None,
    ) -> None:
        request_id = ""
        try:
            if isinstance(prepared, Exception):
                raise prepared
            message, decoded = prepared
            request_id = message.id
            if isinstance(decoded, InferenceServerError):
                self._check_model(message, None)
                raise decoded
            request = decoded
            if metadata:
                self.header_forward.apply(metadata, request.parameters)
            if self.core.is_decoupled(request.model_name, request.model_version):
                # 0..N responses, each marked with triton_final_response as Triton marks them
                responses = self.core.infer_stream(request, mark_final=True)
                task = asyncio.ensure_future(_relay(request, responses, outbox))
                pending.add(task)
                task.add_done_callback(pending.discard)
                return
            trace = None
            if self.core.tracer.active:
                trace = self.core.tracer.sample(request.model_name)
                if trace is not None:
                    trace.capture("GRPC_WAITREAD_START", request.received_ns)
                    trace.capture("GRPC_WAITREAD_END", request.received_ns)
                    request.trace = trace
            future = self.core.infer(request, caller="ModelStreamInfer RPC")
        except Exception as exc:
            _, text = failure_status(exc, "ModelStreamInfer")
            outbox.put_nowait(response_codec.encode_stream_error(text, request_id))
            return
        pending.add(future)

        def done(future: asyncio.Future[Any]) -> None:
            pending.discard(future)
            if future.cancelled():
                return
            try:
                encoded = response_codec.encode_stream_response(future.result())
            except Exception as exc:
                _, text = failure_status(exc, "ModelStreamInfer")
                encoded = response_codec.encode_stream_error(
                    text, request.id, request.model_name, request.model_version, final=True
                )
            outbox.put_nowait(encoded if trace is None else (encoded, trace))

        future.add_done_callback(done)

    # ---- registration -----------------------------------------------------------------------

    def method_handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        """`inference.GRPCInferenceService`'s methods."""
        handlers: dict[str, grpc.RpcMethodHandler] = {}
        for method, category, attribute, request_type in UNARY_METHODS:
            handlers[method] = grpc.unary_unary_rpc_method_handler(
                restricted(
                    self.restrictions, category, unary_handler(method, getattr(self, attribute))
                ),
                request_deserializer=request_type.FromString,
                response_serializer=_serialize,
            )
        # The infer RPCs take and return bytes: codec.py does the (de)serialization.
        handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(
            restricted(self.restrictions, "inference", self.model_infer)
        )
        handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
            restricted(self.restrictions, "inference", self.model_stream_infer)
        )
        return handlers

    def health_handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        """`grpc.health.v1.Health/Check` (Watch is not offered, as by Triton)."""
        return {
            "Check": grpc.unary_unary_rpc_method_handler(
                restricted(self.restrictions, "health", unary_handler("Check", self.health_check)),
                request_deserializer=health.HealthCheckRequest.FromString,
                response_serializer=_serialize,
            )
        }


def _serialize(message: Any) -> bytes:
    data: bytes = message.SerializeToString()
    return data


async def _write_all(outbox: Outbox, context: Context) -> None:
    while True:
        item = await outbox.get()
        if item is None:
            return
        if isinstance(item, tuple):
            data, trace = item
            trace.capture("GRPC_SEND_START", time.monotonic_ns())
            await context.write(data)
            trace.capture("GRPC_SEND_END", time.monotonic_ns())
            trace.finish()
        else:
            await context.write(item)
