"""What a Python model asks of the server while it runs: BLS inference requests, pb_utils'
model readiness and model control, and custom metrics.

Messages arrive on a stub's reader thread; everything that touches the server core is handed to
the core's event loop (the ServerHandle the backend was loaded with) and answered from there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from oceanus.backends.python import messages as msg
from oceanus.backends.python import transport as tp
from oceanus.backends.python.stub_launcher import Stub
from oceanus.core.backend import ServerHandle
from oceanus.core.errors import InferenceServerError, internal, unavailable
from oceanus.core.observability.custom_metrics import MetricError, MetricOwner
from oceanus.core.types import InferRequest, InferResponse, RequestedOutput, Tensor

# How a BLS request names itself when the server refuses a decoupled model.
BLS_CALLER = "BLS"
_METRIC_CALLS = {
    "family_new": "new_family",
    "metric_new": "new_metric",
    "metric_value": "value",
}
_METRIC_UPDATES = ("increment", "set", "observe")


class ServerCalls:
    """Serves one model instance's calls into the server (`server` None: not in a server)."""

    def __init__(self, server: ServerHandle | None, model_name: str) -> None:
        self.server = server
        self.model_name = model_name
        self._tasks: set[asyncio.Future[Any]] = set()

    # ---- pb_utils calls ------------------------------------------------------------------------

    def on_call(self, channel: tp.Channel, metrics: MetricOwner, message: msg.Call) -> None:
        call_id, operation, args = message.call_id, message.operation, message.args
        if operation in _METRIC_CALLS:
            try:
                result = getattr(metrics, _METRIC_CALLS[operation])(*args)
            except MetricError as exc:
                answer(channel, call_id, str(exc), None)
            else:
                answer(channel, call_id, None, result)
            return
        server = self.server
        if server is None:
            answer(channel, call_id, f"pb_utils.{operation} needs a running server", None)
            return
        server.loop.call_soon_threadsafe(
            self._call_on_loop, server, channel, call_id, operation, args
        )

    def _call_on_loop(
        self, server: ServerHandle, channel: tp.Channel, call_id: int, operation: str, args: Any
    ) -> None:
        """On the event loop: readiness, load and unload through the server core."""
        if operation == "model_ready":
            name, version = args
            answer(channel, call_id, None, bool(server.model_ready(name, version)))
            return
        if operation == "load_model":
            name, config, files = args
            wrong = [key for key in files if not key.startswith("file:")]
            if wrong:
                error = f"Unrecognized load parameter '{wrong[0]}' with type 'BYTES'"
                answer(channel, call_id, error, None)
                return
            contents = {key[len("file:") :]: value for key, value in files.items()}
            coroutine = server.load_model(name, config or None, contents or None)
        elif operation == "unload_model":
            name = args[0]
            coroutine = server.unload_model(name)
        else:
            answer(channel, call_id, f"unknown operation '{operation}'", None)
            return
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)

        def done(task: asyncio.Future[None]) -> None:
            self._tasks.discard(task)
            if task.cancelled():
                answer(channel, call_id, "cancelled", None)
                return
            exc = task.exception()
            if exc is None:
                answer(channel, call_id, None, None)
            else:
                answer(channel, call_id, as_server_error(exc).message, None)

        if operation == "unload_model" and name == self.model_name:
            # A model unloading itself from execute(): the unload waits for that very request,
            # so the answer cannot wait for the unload.
            task.add_done_callback(self._tasks.discard)
            answer(channel, call_id, None, None)
            return
        task.add_done_callback(done)

    # ---- BLS ---------------------------------------------------------------------------------

    def on_bls(self, stub: Stub, message: msg.Bls) -> None:
        arrays = tp.unpack_copies(stub.reader, message.location, message.descs)
        parameters: dict[str, Any] = (
            json.loads(message.parameters_json) if message.parameters_json else {}
        )
        if message.correlation_id:
            parameters["sequence_id"] = message.correlation_id
        if message.flags & 1:
            parameters["sequence_start"] = True
        if message.flags & 2:
            parameters["sequence_end"] = True
        if message.timeout:
            parameters["timeout"] = message.timeout
        version = message.model_version
        names = message.output_names
        request = InferRequest(
            model_name=message.model_name,
            model_version=str(version) if version >= 0 else "",
            id=message.request_id,
            inputs=[Tensor(n, d, tuple(a.shape), a) for n, d, a in arrays],
            outputs=[RequestedOutput(n) for n in names] if names else None,
            parameters=parameters,
        )
        server = self.server
        bls_id = message.bls_id
        if server is None:
            _bls_reply(stub, bls_id, None, internal("BLS needs a running server"), True)
            return
        server.loop.call_soon_threadsafe(
            self._bls_start, server, stub, bls_id, request, message.decoupled
        )

    def _bls_start(
        self,
        server: ServerHandle,
        stub: Stub,
        bls_id: int,
        request: InferRequest,
        decoupled: bool,
    ) -> None:
        """On the event loop: run the request through the core. Errors before the request is
        queued get Triton's BLS wording (request_executor.cc)."""
        name, version = request.model_name, request.model_version
        try:
            if not server.model_serving(name, version):
                raise internal(
                    f"Failed for execute the inference request. Model '{name}' is not ready."
                )
            if decoupled:
                # A decoupled model's final flag sent alone reaches a BLS caller as an empty
                # response, as in Triton.
                stream = server.infer_stream(request, empty_final=True)
                task = asyncio.ensure_future(_bls_stream(stub, bls_id, stream))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                return
            if server.is_decoupled(name, version):
                raise internal(
                    f"Model {name} is using the decoupled. The current BLS request call doesn't "
                    "support models using the decoupled transaction policy. Please use "
                    "'decoupled=True' argument to the 'exec' or 'async_exec' calls for "
                    "decoupled models.'"
                )
            future = server.infer(request, caller=BLS_CALLER)
        except InferenceServerError as exc:
            error = internal(f"Model {name} - Error when running inference: {exc.message}")
            _bls_reply(stub, bls_id, None, error, True)
            return

        def done(future: asyncio.Future[InferResponse]) -> None:
            if future.cancelled():
                _bls_reply(stub, bls_id, None, unavailable("request cancelled"), True)
                return
            exc = future.exception()
            if exc is None:
                _bls_reply(stub, bls_id, future.result(), None, True)
            else:
                _bls_reply(stub, bls_id, None, as_server_error(exc), True)

        future.add_done_callback(done)


async def _bls_stream(stub: Stub, bls_id: int, stream: AsyncIterator[InferResponse]) -> None:
    try:
        async for response in stream:
            _bls_reply(stub, bls_id, response, None, False)
    except Exception as exc:
        _bls_reply(stub, bls_id, None, as_server_error(exc), True)
        return
    _bls_reply(stub, bls_id, None, None, True)


def _bls_reply(
    stub: Stub,
    bls_id: int,
    response: InferResponse | None,
    error: InferenceServerError | None,
    final: bool,
) -> None:
    try:
        if error is not None:
            payload = msg.error_payload(error.code.name, error.message)
            stub.channel.send(msg.BlsResponse(bls_id, None, payload, final))
        elif response is None:
            stub.channel.send(msg.BlsResponse(bls_id, None, None, final))
        else:
            tensors = [(t.name, t.datatype, t.data) for t in response.outputs]
            parameters = json.dumps(
                {k: v for k, v in response.parameters.items() if isinstance(v, (bool, int, str))}
            )
            stub.channel.send_tensors(
                stub.writer,
                [tensors],
                lambda loc, descs: msg.BlsResponse(
                    bls_id, loc, msg.ok_payload(descs[0], parameters), final
                ),
            )
    except OSError:
        pass  # the stub is gone


def on_metric(metrics: MetricOwner, message: msg.MetricUpdate) -> None:
    """A metric update or deletion (no answer: the stub checked what it could)."""
    number, operation = message.metric_id, message.operation
    if operation in _METRIC_UPDATES:
        metrics.update(number, operation, message.value)
    elif operation == "delete_metric":
        metrics.delete_metric(number)
    elif operation == "delete_family":
        metrics.delete_family(number)


def answer(channel: tp.Channel, call_id: int, error: str | None, result: Any) -> None:
    with contextlib.suppress(OSError):  # the stub is gone
        channel.send(msg.CallAnswer(call_id, error, result))


def as_server_error(exc: BaseException) -> InferenceServerError:
    if isinstance(exc, InferenceServerError):
        return exc
    return internal(f"{type(exc).__name__}: {exc}")
