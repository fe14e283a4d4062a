"""pb_utils' requests and responses: what `execute` gets and returns, response senders for
decoupled models, and BLS requests a model sends to other models (`exec`, `async_exec`)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

from oceanus.backends.python.pb import runtime
from oceanus.backends.python.pb.types import (
    TRITONSERVER_MEMORY_CPU,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    Tensor,
    TritonError,
    TritonModelException,
)


class PreferredMemory:
    """Where BLS outputs should live; Oceanus always returns them in CPU memory."""

    def __init__(
        self, preferred_memory_type: int = TRITONSERVER_MEMORY_CPU, preferred_device_id: int = 0
    ) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


class InferenceResponse:
    """One response: output tensors, or an error; optional parameters (bool, int or str)."""

    def __init__(
        self,
        output_tensors: list[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        if output_tensors is None:
            output_tensors = []
        if not isinstance(output_tensors, list):
            raise TritonModelException('"output_tensors" must be a list.')
        for tensor in output_tensors:
            if not isinstance(tensor, Tensor):
                raise TritonModelException(
                    f"output_tensors must hold pb_utils.Tensor objects, found "
                    f"'{type(tensor).__name__}'"
                )
        if error is not None and not isinstance(error, TritonError):
            raise TritonModelException("error must be a pb_utils.TritonError")
        self._output_tensors = output_tensors
        self._error = error
        self._parameters = _parameters_json(parameters)

    def output_tensors(self) -> list[Tensor]:
        return self._output_tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters


def _parameters_json(parameters: dict[str, Any] | str | None) -> str:
    if parameters is None:
        return "{}"
    parsed = json.loads(parameters) if isinstance(parameters, str) else parameters
    if not isinstance(parsed, dict):
        raise TritonModelException("parameters must be a dictionary")
    for key, value in parsed.items():
        if not isinstance(key, str) or not isinstance(value, (bool, int, str)):
            raise TritonModelException(
                "Expect parameters keys to have type str and values to have type bool, int or str"
            )
    return json.dumps(parsed)


_SENDER_LOCK = threading.Lock()


class InferenceResponseSender:
    """Sends the responses of one request (decoupled models: any number, then the FINAL flag)."""

    def __init__(self, key: int, decoupled: bool) -> None:
        self._key = key
        self._decoupled = decoupled
        self._closed = False
        self._sent = 0
        self._lock = threading.Lock()
        self.done = threading.Event()

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        with self._lock:
            if self._closed:
                raise TritonModelException(
                    "Unable to send response. Response sender has been closed."
                )
            if response is None and not flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                raise TritonModelException(
                    "Inference Response object must be provided when the response flags is "
                    "not set to TRITONSERVER_RESPONSE_COMPLETE_FINAL."
                )
            if response is not None and not isinstance(response, InferenceResponse):
                raise TritonModelException(
                    "send() expects a pb_utils.InferenceResponse, found "
                    f"'{type(response).__name__}'"
                )
            if not self._decoupled and response is not None and self._sent:
                raise TritonModelException(
                    "Non-decoupled model cannot send more than one response."
                )
            if response is not None:
                self._sent += 1
            final = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            if final:
                if not self._decoupled and not self._sent:
                    raise TritonModelException(
                        "Non-decoupled model must send one response before the final flag."
                    )
                self._closed = True
            runtime.current().send_response(self._key, response, flags)
            if final:
                self.done.set()
        if final:
            runtime.current().poke()

    def is_cancelled(self) -> bool:
        return runtime.current().is_cancelled(self._key)

    def _close(self) -> None:
        with self._lock:
            self._closed = True
            self.done.set()

    @property
    def closed(self) -> bool:
        return self._closed


class InferenceRequest:
    """A request given to `execute`, or one built by the model for BLS:

    pb_utils.InferenceRequest(model_name="m", inputs=[...], requested_output_names=[...])
        .exec() / await .async_exec()
    """

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: list[Tensor] | None = None,
        requested_output_names: list[str] | None = None,
        model_name: str = "",
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: PreferredMemory | None = None,
        trace: Any = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._inputs = list(inputs or [])
        self._requested_output_names = list(requested_output_names or [])
        self._model_name = model_name
        self._model_version = model_version
        self._flags = flags
        self._timeout = timeout
        self._preferred_memory = preferred_memory or PreferredMemory()
        self._trace = trace
        self._parameters = _parameters_json(parameters)
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        self._key = -1
        self._decoupled = False
        self._sender: InferenceResponseSender | None = None

    @classmethod
    def _received(
        cls,
        key: int,
        request_id: str,
        correlation_id: int | str,
        flags: int,
        timeout: int,
        parameters: str,
        requested_output_names: list[str],
        inputs: list[Tensor],
        model_name: str,
        model_version: int,
        decoupled: bool,
    ) -> InferenceRequest:
        request = cls.__new__(cls)
        request._request_id = request_id
        request._correlation_id = correlation_id
        request._inputs = inputs
        request._requested_output_names = requested_output_names
        request._model_name = model_name
        request._model_version = model_version
        request._flags = flags
        request._timeout = timeout
        request._preferred_memory = PreferredMemory()
        request._trace = None
        request._parameters = parameters
        request._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        request._key = key
        request._decoupled = decoupled
        request._sender = None  # made on first use: most models never ask for it
        return request

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        return self._parameters

    def requested_output_names(self) -> list[str]:
        return self._requested_output_names

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def trace(self) -> Any:
        return self._trace

    def is_cancelled(self) -> bool:
        if self._key < 0:
            return False
        return runtime.current().is_cancelled(self._key)

    def get_response_sender(self) -> InferenceResponseSender:
        if self._key < 0:
            raise TritonModelException("only requests given to execute() have a response sender")
        with _SENDER_LOCK:
            if self._sender is None:
                self._sender = InferenceResponseSender(self._key, self._decoupled)
            return self._sender

    def set_release_flags(self, flags: int) -> None:
        if flags != TRITONSERVER_REQUEST_RELEASE_ALL:
            raise TritonModelException(
                "request rescheduling (TRITONSERVER_REQUEST_RELEASE_RESCHEDULE) needs iterative "
                "sequence batching, which Oceanus does not implement"
            )
        self._release_flags = flags

    def release_flags(self) -> int:
        return self._release_flags

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on `model_name` and wait: an InferenceResponse (with `error()` set on
        failure), or for `decoupled=True` an iterator of responses."""
        self._check_bls()
        future = runtime.current().bls(self, decoupled)
        runtime.current().wait(future.done)
        return future.result()

    def async_exec(self, decoupled: bool = False) -> Any:
        """Like `exec`, as an awaitable (use from `async def execute`)."""
        self._check_bls()
        return asyncio.wrap_future(runtime.current().bls(self, decoupled))

    def _check_bls(self) -> None:
        if not self._model_name:
            raise TritonModelException("BLS requests must name the model (model_name=...)")


class ResponseIterator:
    """The responses of a decoupled BLS request, in order; iterate with `for` or `async for`."""

    def __init__(self) -> None:
        import queue

        self._queue: queue.SimpleQueue[InferenceResponse | None] = queue.SimpleQueue()
        self._done = False

    def _put(self, response: InferenceResponse | None) -> None:
        self._queue.put(response)

    def __iter__(self) -> Iterator[InferenceResponse]:
        return self

    def __next__(self) -> InferenceResponse:
        if self._done:
            raise StopIteration
        runtime.current().wait(lambda: not self._queue.empty())
        item = self._queue.get()
        if item is None:
            self._done = True
            raise StopIteration
        return item

    def __aiter__(self) -> AsyncIterator[InferenceResponse]:
        return self

    async def __anext__(self) -> InferenceResponse:
        if self._done:
            raise StopAsyncIteration
        try:
            return await asyncio.get_running_loop().run_in_executor(None, self.__next__)
        except StopIteration:
            raise StopAsyncIteration from None

    def cancel(self) -> None:
        """Accepted for compatibility; the request runs to completion."""
