"""Requests and responses of the in-process API, with Triton's names and fields.

A request becomes the core's `InferRequest` on the caller's thread (arrays are passed, not
copied); its responses come back from the core's loop through a queue the caller reads:
`ResponseIterator` blocks (a `queue.SimpleQueue`), `AsyncResponseIterator` awaits (an
`asyncio.Queue` of the caller's loop). A one-response model gives one response, `final` set;
a decoupled model gives each response as the model sends it, the last one `final` (an empty
one when the model sent the final flag alone).
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from oceanus.core.errors import InferenceServerError
from oceanus.core.types import InferRequest, InferResponse, RequestedOutput
from oceanus.embedded.errors import TritonError, translate
from oceanus.embedded.tensor import Tensor

if TYPE_CHECKING:
    from oceanus.embedded.model import Model

# Triton's request flags (TRITONSERVER_RequestFlag)
SEQUENCE_START = 1
SEQUENCE_END = 2

# What the core's loop puts in a response queue: (response, error, final).
Item = tuple[InferResponse | None, InferenceServerError | None, bool]


@dataclass
class InferenceRequest:
    """One inference request (Triton's fields); `inputs` maps names to numpy arrays, lists,
    DLPack producers or `Tensor`s. `timeout` is in microseconds; `flags` carries
    SEQUENCE_START / SEQUENCE_END for sequence models."""

    model: Model
    request_id: str | None = None
    flags: int = 0
    correlation_id: int | str | None = None
    priority: int = 0
    timeout: int = 0
    inputs: dict[str, Any] = field(default_factory=dict)
    parameters: dict[str, str | int | bool | float] = field(default_factory=dict)
    output_memory_type: Any = None
    response_queue: queue.SimpleQueue[Any] | asyncio.Queue[Any] | None = None
    # Oceanus: ask for these outputs only (None: every output of the model).
    outputs: list[str] | None = None

    def _to_core(self) -> InferRequest:
        inputs = [Tensor._from_object(value)._to_core(name) for name, value in self.inputs.items()]
        parameters: dict[str, Any] = dict(self.parameters)
        if self.priority:
            parameters["priority"] = self.priority
        if self.timeout:
            parameters["timeout"] = self.timeout
        if self.correlation_id is not None:
            parameters["sequence_id"] = self.correlation_id
        if self.flags & SEQUENCE_START:
            parameters["sequence_start"] = True
        if self.flags & SEQUENCE_END:
            parameters["sequence_end"] = True
        outputs = None if self.outputs is None else [RequestedOutput(n) for n in self.outputs]
        return InferRequest(
            model_name=self.model.name,
            model_version="" if self.model.version < 0 else str(self.model.version),
            id=self.request_id or "",
            inputs=inputs,
            outputs=outputs,
            parameters=parameters,
            received_ns=time.monotonic_ns(),
        )


@dataclass
class InferenceResponse:
    """One response: its outputs as `Tensor`s (read them with `numpy.from_dlpack`), the
    parameters the model set, the error when the model answered with one, and whether it is
    the request's last response."""

    model: Model
    request_id: str | None = None
    parameters: dict[str, str | int | bool] = field(default_factory=dict)
    outputs: dict[str, Tensor] = field(default_factory=dict)
    error: TritonError | None = None
    classification_label: str | None = None
    final: bool = False


def response_from(model: Model, item: Item, raise_on_error: bool) -> InferenceResponse:
    core_response, error, final = item
    if error is not None:
        translated = translate(error)
        if raise_on_error:
            raise translated
        return InferenceResponse(model, final=final, error=translated)
    if core_response is None:
        return InferenceResponse(model, final=final)
    parameters = core_response.parameters
    if "triton_final_response" in parameters:
        parameters = dict(parameters)
        del parameters["triton_final_response"]
    return InferenceResponse(
        model,
        request_id=core_response.id or None,
        parameters=parameters,
        outputs={t.name: Tensor._from_core(t) for t in core_response.outputs},
        final=final,
    )


class ResponseIterator:
    """A request's responses, waited for on the caller's thread."""

    def __init__(
        self,
        model: Model,
        responses: queue.SimpleQueue[Item],
        raise_on_error: bool,
        cancel: Callable[[], None],
    ) -> None:
        self._model = model
        self._queue = responses
        self._raise = raise_on_error
        self._cancel = cancel
        self._complete = False

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        if self._complete:
            raise StopIteration
        item = self._queue.get()
        self._complete = item[2] or item[1] is not None
        return response_from(self._model, item, self._raise)

    def cancel(self) -> None:
        """Ask the core to drop the request (queued requests leave the queue)."""
        self._cancel()


class AsyncResponseIterator:
    """A request's responses, awaited on the caller's event loop."""

    def __init__(
        self,
        model: Model,
        responses: asyncio.Queue[Item],
        raise_on_error: bool,
        cancel: Callable[[], None],
    ) -> None:
        self._model = model
        self._queue = responses
        self._raise = raise_on_error
        self._cancel = cancel
        self._complete = False

    def __aiter__(self) -> AsyncResponseIterator:
        return self

    async def __anext__(self) -> InferenceResponse:
        if self._complete:
            raise StopAsyncIteration
        item = await self._queue.get()
        self._complete = item[2] or item[1] is not None
        return response_from(self._model, item, self._raise)

    def cancel(self) -> None:
        self._cancel()
