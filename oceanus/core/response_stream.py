"""The responses of one request to a decoupled model (`ResponseStream`), and several of them
handed to the event loop at once (`send_together`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import numpy as np

from oceanus.core.errors import InferenceServerError
from oceanus.core.types import InferRequest, InferResponse

if TYPE_CHECKING:
    from oceanus.core.generation import GenerationOutput
    from oceanus.core.model import ModelVersion


class ResponseStream:
    """The responses of one request to a decoupled model, in the order the model sends them.

    Backends call `send` from any thread; it hands each response to the event loop."""

    __slots__ = (
        "_empty_final",
        "_first_sent",
        "_left",
        "_loop",
        "_mark_final",
        "_model",
        "_queue",
        "_request",
    )

    def __init__(
        self,
        model: ModelVersion,
        request: InferRequest,
        loop: asyncio.AbstractEventLoop,
        empty_final: bool | None = None,
        mark_final: bool | None = None,
    ) -> None:
        self._model = model
        self._request = request
        self._loop = loop
        self._queue: asyncio.Queue[
            tuple[InferResponse | None, InferenceServerError | None, bool]
        ] = asyncio.Queue()
        # As Triton's gRPC stream: with this request parameter, a final flag sent alone is an
        # empty response and every response says whether it is the final one.
        asked = bool(request.parameters.get("triton_enable_empty_final_response"))
        self._mark_final = asked if mark_final is None else mark_final
        self._empty_final = asked if empty_final is None else empty_final
        # Set on the loop when the reader leaves before the final response; read by backend
        # threads (a plain bool: a stale read only delays the cancellation by one poll).
        self._left = False
        self._first_sent = False

    def cancelled(self) -> bool:
        return self._left

    def send(
        self,
        outputs: dict[str, np.ndarray] | None,
        error: InferenceServerError | None,
        final: bool,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        """One response (outputs, and the parameters the model set on it), an error, or the
        final flag alone (both None)."""
        with contextlib.suppress(RuntimeError):  # RuntimeError: the loop closed (stopping)
            self._loop.call_soon_threadsafe(self._put_outputs, outputs, error, final, parameters)

    def _put_outputs(
        self,
        outputs: dict[str, np.ndarray] | None,
        error: InferenceServerError | None,
        final: bool,
        parameters: dict[str, Any] | None = None,
        generation: GenerationOutput | None = None,
    ) -> None:
        try:
            response = None if outputs is None else self._model._response(self._request, outputs)
        except InferenceServerError as exc:  # an output does not fit its shared memory region
            response, error = None, exc
        if response is not None and parameters:
            response.parameters.update(parameters)
        if response is not None:
            response.generation = generation
        if response is not None and not self._first_sent:
            # nv_inference_first_response_histogram_ms: when a streamed answer began.
            self._first_sent = True
            latency = self._model.stats.latency
            if latency is not None:
                now = self._model.clock.now_ns()
                latency.observe_first_response(now - self._request.received_ns)
        self.put(response, error, final)

    def put(
        self, response: InferResponse | None, error: InferenceServerError | None, final: bool
    ) -> None:
        """On the loop."""
        self._queue.put_nowait((response, error, final))

    async def responses(self, future: asyncio.Future[Any]) -> AsyncIterator[InferResponse]:
        finished = False
        try:
            while True:
                response, error, final = await self._queue.get()
                if error is not None:
                    raise error
                if response is None and final and self._empty_final:
                    response = InferResponse(
                        model_name=self._model.name,
                        model_version=self._model.version_str,
                        id=self._request.id,
                        outputs=[],
                    )
                if response is not None:
                    if self._mark_final:
                        response.parameters["triton_final_response"] = final
                    yield response
                if final:
                    finished = True
                    return
        finally:
            if not finished:
                self._left = True
                if not future.done():
                    future.cancel()  # the caller left: a queued request leaves the queue


# (stream, outputs, error, final, typed output): one response as `ResponseStream.send` takes
# it, with an engine's GenerationOutput for a request that carried a GenerationRequest.
Send = tuple[
    Any, dict[str, np.ndarray] | None, InferenceServerError | None, bool, "GenerationOutput | None"
]


def send_together(sends: list[Send]) -> None:
    """Several responses, of any requests, handed to the loop in ONE wake-up (in this order).

    For a backend thread that produces many responses at once (the LLM engine: one token for
    every running request per step): a `send` each would wake the event loop once per
    response, and on a small machine every wake-up takes the GIL and a core from the thread
    doing the model's work. Streams that are not the core's are sent to one by one."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Send]] = {}
    for send in sends:
        stream = send[0]
        if isinstance(stream, ResponseStream):
            by_loop.setdefault(stream._loop, []).append(send)
        else:
            stream.send(send[1], send[2], send[3])  # a warmup's: never a typed request
    for loop, items in by_loop.items():
        with contextlib.suppress(RuntimeError):  # the loop closed (stopping)
            loop.call_soon_threadsafe(_put_all, items)


def _put_all(items: list[Send]) -> None:
    for stream, outputs, error, final, generation in items:
        stream._put_outputs(outputs, error, final, None, generation)
