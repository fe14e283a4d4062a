"""The stub: the process of one Python model instance (Triton's word for it),
`python -m oceanus.backends.python.pb_stub FD`.

FD is this end of a socketpair to the server. The first message is INIT (load model.py, call
`initialize`, answer READY) or AUTOCOMPLETE (call `auto_complete_config`, answer, exit).

Threads: the main thread runs the model (`execute`, then the next batch); a reader thread takes
every message off the socket, queues batches for the main thread and completes BLS calls and
cancellation queries, so a model blocked in `exec()` still gets its answer. `async def execute`
runs on an asyncio loop in a third thread (created on first use), as in Triton. When the server
goes away (end of file on the socket) the process exits at once.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import itertools
import json
import os
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from oceanus.backends.python import messages as msg
from oceanus.backends.python import transport as tp
from oceanus.backends.python import utils as pb
from oceanus.backends.python.model_code import (
    AsyncRunner,
    BackendError,
    check_returned,
    describe,
    format_exception,
    load_module,
    model_class,
)
from oceanus.backends.python.pb import metrics, runtime
from oceanus.backends.python.pb.requests import ResponseIterator
from oceanus.backends.python.pb.types import ERROR_CODE_NAMES, ERROR_CODES_BY_NAME

# The standby reader takes over reading after the socket went unread this long (the main thread
# reads it whenever it waits for the next batch or for an answer).
STANDBY_AFTER_S = 0.02
# How long an `async def is_ready` may take (the server reports not ready after this long too).
IS_READY_TIMEOUT_S = 5.0


class PbStub(runtime.Runtime):
    def __init__(self, channel: tp.Channel) -> None:
        self.channel = channel
        # Batches (and FINALIZE) for the main thread, each with its opened ring block (or None);
        # read by whichever thread reads the socket.
        self.inbox: collections.deque[Any] = collections.deque()
        self.mailbox = tp.Mailbox(
            channel, self._on_message, self._server_gone, standby_after_s=STANDBY_AFTER_S
        )
        self.model: Any = None
        self.model_name = ""
        self.instance_name = ""
        self.model_version = -1
        self.decoupled = False
        # Between initialize() and finalize(): BLS requests are refused outside (as in Triton).
        self.serving = False
        self.writer: tp.RingWriter | None = None
        self.reader: tp.RingReader | None = None
        self._bls: dict[int, Any] = {}
        self._queries: dict[int, concurrent.futures.Future[bool]] = {}
        self._calls: dict[int, concurrent.futures.Future[tuple[str | None, Any]]] = {}
        self._ids = itertools.count(1)
        self.runner = AsyncRunner()  # the loop `async def` methods run on
        self._background: set[concurrent.futures.Future[Any]] = set()

    # ---- messages from the server -----------------------------------------------------------

    def _on_message(self, message: msg.Message) -> None:
        """Dispatch one message (called by the reading thread, under the mailbox's lock)."""
        if isinstance(message, msg.BlsResponse):
            self._on_bls_response(message)
        elif isinstance(message, msg.QueryAnswer):
            future = self._queries.pop(message.query_id, None)
            if future is not None:
                future.set_result(bool(message.cancelled))
        elif isinstance(message, msg.CallAnswer):
            call = self._calls.pop(message.call_id, None)
            if call is not None:
                call.set_result((message.error, message.result))
        elif isinstance(message, msg.IsReady):
            threading.Thread(
                target=self._check_ready, args=(message.check_id,), name="is_ready", daemon=True
            ).start()
        elif isinstance(message, msg.Exec):
            # Its block is opened now, in the order blocks were placed (a BLS response placed
            # after it may be opened before the main thread gets to this batch; rings.py).
            assert self.reader is not None
            loc = message.location
            self.inbox.append((message, self.reader.open(loc) if loc is not None else None))
        else:
            self.inbox.append((message, None))

    @staticmethod
    def _server_gone() -> None:
        os._exit(0)  # the server is gone: nothing left to serve

    def _on_bls_response(self, message: msg.BlsResponse) -> None:
        bls_id, final = message.bls_id, message.final
        target = self._bls.get(bls_id)
        response = self._response_from(message.location, message.payload)
        if isinstance(target, ResponseIterator):
            if response is not None:
                target._put(response)
            if final:
                self._bls.pop(bls_id, None)
                target._put(None)
            return
        self._bls.pop(bls_id, None)
        if target is not None and not target.done():
            target.set_result(response)

    def _response_from(self, loc: Any, payload: msg.Payload | None) -> pb.InferenceResponse | None:
        if payload is None:
            return None
        if msg.is_error(payload):
            _, code, message = payload
            return pb.InferenceResponse(
                error=pb.TritonError(message, ERROR_CODES_BY_NAME.get(code, 1))
            )
        _, descs, parameters = payload
        assert self.reader is not None
        block, token = self.reader.open(loc) if loc is not None else (None, None)
        try:
            arrays = tp.unpack(block, descs, copy=True)
        finally:
            self.reader.release(token)
        response = pb.InferenceResponse([pb.Tensor._wrap(n, d, a) for n, d, a in arrays])
        response._parameters = parameters
        return response

    # ---- the runtime services of pb_utils --------------------------------------------------------

    def send_response(self, key: int, response: pb.InferenceResponse | None, flags: int) -> None:
        final = bool(flags & pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if response is None:
            self.channel.send(msg.Response(key, None, None, final))
            return
        if response.has_error():
            error = response.error()
            assert error is not None
            code = ERROR_CODE_NAMES.get(error.code(), "INTERNAL")
            self.channel.send(
                msg.Response(key, None, msg.error_payload(code, error.message()), final)
            )
            return
        tensors = [(t.name(), t.datatype(), t.as_numpy()) for t in response.output_tensors()]
        parameters = response.parameters()
        assert self.writer is not None
        self.channel.send_tensors(
            self.writer,
            [tensors],
            lambda loc, descs: msg.Response(key, loc, msg.ok_payload(descs[0], parameters), final),
        )

    def is_cancelled(self, key: int) -> bool:
        query_id = next(self._ids)
        future: concurrent.futures.Future[bool] = concurrent.futures.Future()
        self._queries[query_id] = future
        self.channel.send(msg.Query(query_id, key))
        self.wait(future.done)
        return future.result()

    def wait(self, done: Callable[[], bool]) -> None:
        self.mailbox.wait(done)

    def poke(self) -> None:
        self.mailbox.poke()

    def bls(self, request: pb.InferenceRequest, decoupled: bool) -> concurrent.futures.Future[Any]:
        if not self.serving:
            raise pb.TritonModelException("BLS is only supported during the 'execute' function.")
        bls_id = next(self._ids)
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if decoupled:
            iterator = ResponseIterator()
            self._bls[bls_id] = iterator
            future.set_result(iterator)
        else:
            self._bls[bls_id] = future
        tensors = [(t.name(), t.datatype(), t.as_numpy()) for t in request.inputs()]

        def build(loc: tp.Location | None, descs: list[list[tp.TensorDesc]]) -> msg.Bls:
            return msg.Bls(
                bls_id,
                request.model_name(),
                int(request.model_version()),
                request.request_id(),
                request.correlation_id(),
                int(request.flags()),
                int(request.timeout()),
                request.parameters(),
                list(request.requested_output_names()),
                bool(decoupled),
                loc,
                descs[0],
            )

        assert self.writer is not None
        self.channel.send_tensors(self.writer, [tensors], build)
        return future

    def log(self, level: str, message: str) -> None:
        self.channel.send(msg.Log(level, message))

    def server_call(self, operation: str, *args: Any) -> Any:
        """Ask the server and wait for its answer (reading messages meanwhile)."""
        call_id = next(self._ids)
        future: concurrent.futures.Future[tuple[str | None, Any]] = concurrent.futures.Future()
        self._calls[call_id] = future
        self.channel.send(msg.Call(call_id, operation, args))
        self.wait(future.done)
        error, result = future.result()
        if error is not None:
            raise pb.TritonModelException(error)
        return result

    def metric_call(self, operation: str, *args: Any) -> Any:
        return self.server_call(operation, *args)

    def metric_update(self, metric_id: int, operation: str, value: float) -> None:
        self.channel.send(msg.MetricUpdate(metric_id, operation, value))

    def metric_delete(self, what: str, number: int) -> None:
        self.channel.send(msg.MetricUpdate(number, "delete_" + what, 0.0))

    def _check_ready(self, check_id: int) -> None:
        """The model's is_ready() (its own thread: the main thread may be executing)."""
        ready, error = False, None
        try:
            result = self.model.is_ready()
            if asyncio.iscoroutine(result):
                result = self.runner.run(result).result(timeout=IS_READY_TIMEOUT_S)
            if not isinstance(result, bool):
                raise BackendError("is_ready() must return a boolean value")
            ready = result
        except BaseException as exc:
            error = describe(exc)
        with contextlib.suppress(OSError):
            self.channel.send(msg.IsReadyAnswer(check_id, ready, error))

    # ---- the model ----------------------------------------------------------------------------

    def initialize(self, message: msg.Init) -> None:
        model_path, args = message.model_path, message.args
        self.model_name = args["model_name"]
        self.instance_name = args["model_instance_name"]
        self.model_version = int(args["model_version"])
        self.decoupled = message.decoupled
        self.reader = tp.RingReader(message.s2w, message.capacity)
        self.writer = tp.RingWriter(
            message.w2s, message.capacity, message.spill_prefix, message.growth
        )
        try:
            self.model = model_class(load_module(model_path), model_path)()
            if not hasattr(self.model, "execute"):
                raise AttributeError(
                    f"Python model {model_path} does not implement `execute` method."
                )
            initialize = getattr(self.model, "initialize", None)
            if initialize is not None:
                result = initialize(args)
                if asyncio.iscoroutine(result):
                    self._await(result)
        except BaseException as exc:
            self.channel.send(msg.Ready(format_exception(exc), False))
            raise SystemExit(1) from None
        self.serving = True
        metrics.flush_deferred()
        self.channel.send(msg.Ready(None, callable(getattr(self.model, "is_ready", None))))

    def _await(self, coroutine: Any) -> Any:
        """Run a coroutine on the stub's loop and wait for it, reading messages meanwhile (the
        coroutine may be waiting for a BLS response)."""
        future = self.runner.run(coroutine)
        future.add_done_callback(lambda _: self.mailbox.poke())
        self.mailbox.wait(future.done, wakeable=True)
        return future.result()

    def execute(self, message: msg.Exec, opened: tuple[Any, Any] | None) -> None:
        batch_id, entries = message.batch_id, message.requests
        assert self.reader is not None and self.writer is not None
        block, token = opened if opened is not None else (None, None)
        # Decoupled models may keep requests after execute returns: they get copies.
        copy = self.decoupled
        requests = []
        for key, request_id, correlation_id, flags, timeout, parameters, names, descs in entries:
            inputs = [pb.Tensor._wrap(n, d, a) for n, d, a in tp.unpack(block, descs, copy)]
            requests.append(
                pb.InferenceRequest._received(
                    key,
                    request_id,
                    correlation_id,
                    flags,
                    timeout,
                    parameters,
                    names,
                    inputs,
                    self.model_name,
                    self.model_version,
                    self.decoupled,
                )
            )
        if copy:
            self.reader.release(token)
            token = None
        try:
            results = self._call_execute(requests)
        except BaseException as exc:
            text = (
                f"Failed to process the request(s) for model '{self.instance_name}', message: "
                + describe(exc)
            )
            for request in requests:  # no response may follow the batch's error
                request.get_response_sender()._close()
            self.reader.release(token)
            self.channel.send(msg.Result(batch_id, None, None, text))
            return
        groups: list[list[tp.TensorItem]] = []
        payloads: list[msg.Payload | None] = []
        for request, response in zip(requests, results, strict=True):
            if response is None:
                payloads.append(None)
                groups.append([])
            elif response.has_error():
                error = response.error()
                assert error is not None
                code = ERROR_CODE_NAMES.get(error.code(), "INTERNAL")
                payloads.append(msg.error_payload(code, error.message()))
                groups.append([])
            else:
                wanted = set(request.requested_output_names())
                groups.append(
                    [
                        (t.name(), t.datatype(), t.as_numpy())
                        for t in response.output_tensors()
                        if t.name() in wanted
                    ]
                )
                payloads.append(msg.ok_payload([], response.parameters()))
        reader = self.reader

        def build(loc: Any, descs: list[list[tp.TensorDesc]]) -> msg.Result:
            out = [
                payload
                if payload is None or msg.is_error(payload)
                else msg.ok_payload(group, payload[2])
                for payload, group in zip(payloads, descs, strict=True)
            ]
            return msg.Result(batch_id, loc, out, None)

        self.channel.send_tensors(self.writer, groups, build, lambda: reader.release(token))

    def _call_execute(
        self, requests: list[pb.InferenceRequest]
    ) -> Sequence[pb.InferenceResponse | None]:
        returned = self.model.execute(requests)
        if asyncio.iscoroutine(returned):
            if self.decoupled:
                future = self.runner.run(returned)
                self._background.add(future)
                future.add_done_callback(lambda f: self._background_done(f, requests))
                return [None] * len(requests)
            returned = self._await(returned)
        responses = check_returned(returned, requests, self.instance_name, self.decoupled)
        if responses is not None:
            return responses
        if not self.decoupled:
            # Responses went (or go) through the response senders, one per request; a request
            # whose sender was never asked for gets no response (the server says so).
            senders = [r._sender for r in requests if r._sender is not None]
            self.mailbox.wait(
                lambda: all(sender.done.is_set() for sender in senders), wakeable=True
            )
        return [None] * len(requests)

    def _background_done(
        self, future: concurrent.futures.Future[Any], requests: list[pb.InferenceRequest]
    ) -> None:
        self._background.discard(future)
        exc = future.exception()
        if exc is None:
            return
        text = format_exception(exc)
        self.log("ERROR", text)
        # Close the requests the model left open, so their clients are not kept waiting.
        for request in requests:
            sender = request.get_response_sender()
            if not sender.closed:
                with contextlib.suppress(pb.TritonModelException):
                    sender.send(
                        pb.InferenceResponse(error=pb.TritonError(text)),
                        pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                    )

    def finalize(self) -> None:
        self.serving = False
        finalize = getattr(self.model, "finalize", None)
        if finalize is not None:
            try:
                result = finalize()
                if asyncio.iscoroutine(result):
                    self._await(result)
            except BaseException as exc:
                self.log("ERROR", f"finalize failed: {format_exception(exc)}")
        metrics.flush_deferred()
        self.channel.send(msg.Finalized())

    def serve(self) -> None:
        inbox = self.inbox
        while True:
            self.mailbox.wait(lambda: bool(inbox))
            message, opened = inbox.popleft()
            if isinstance(message, msg.Exec):
                self.execute(message, opened)
                if metrics.DEFERRED:  # metrics the model let go of
                    metrics.flush_deferred()
            elif isinstance(message, msg.Finalize):
                self.finalize()
                return


def autocomplete(channel: tp.Channel, message: msg.Autocomplete) -> None:
    model_path, config_json = message.model_path, message.config_json
    try:
        module = load_module(model_path)
        function = getattr(getattr(module, "TritonPythonModel", None), "auto_complete_config", None)
        if function is None:
            channel.send(msg.Ready(None, config_json))
            return
        config = pb.ModelConfig(config_json)
        returned = function(config)
        if isinstance(returned, pb.ModelConfig):
            config = returned
        channel.send(msg.Ready(None, json.dumps(config.as_dict())))
    except BaseException as exc:
        channel.send(msg.Ready(format_exception(exc), ""))


def main() -> None:
    fd = int(sys.argv[1])
    sock = socket.socket(fileno=fd)
    sock.set_inheritable(False)
    channel = tp.Channel(sock)
    # model.py files import this name; inside a stub it is the real implementation.
    sys.modules.setdefault("triton_python_backend_utils", pb)
    message = channel.recv()
    if isinstance(message, msg.Autocomplete):
        autocomplete(channel, message)
        return
    assert isinstance(message, msg.Init)
    stub = PbStub(channel)
    runtime.install(stub)
    stub.initialize(message)
    threading.Thread(target=stub.mailbox.standby, name="standby-reader", daemon=True).start()
    stub.serve()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
