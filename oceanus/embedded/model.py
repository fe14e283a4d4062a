"""A model of the in-process server: inference (blocking and asyncio), metadata, config,
statistics, readiness, with the `tritonserver` package's call shapes."""

from __future__ import annotations

import asyncio
import enum
import queue
import threading
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from oceanus.core.errors import ErrorCode, InferenceServerError, internal
from oceanus.core.server import ServerCore
from oceanus.core.types import InferRequest, InferResponse
from oceanus.embedded.errors import InvalidArgumentError, translate
from oceanus.embedded.requests import (
    AsyncResponseIterator,
    InferenceRequest,
    Item,
    ResponseIterator,
    response_from,
)
from oceanus.proto_json import message_to_dict

if TYPE_CHECKING:
    from oceanus.embedded.server import Server

# How the core names this caller in Triton's texts that name one.
CALLER = "in-process API"


class ModelBatchFlag(enum.IntEnum):
    UNKNOWN = 1
    FIRST_DIM = 2


class ModelTxnPropertyFlag(enum.IntEnum):
    ONE_TO_ONE = 1
    DECOUPLED = 2


class Model:
    """One model (version -1: the highest ready version) of a started server."""

    def __init__(
        self,
        server: Server,
        name: str,
        version: int = -1,
        state: str | None = None,
        reason: str | None = None,
    ) -> None:
        server._require_started()
        self._server = server
        self.name = name
        self.version = version
        self.state = state
        self.reason = reason

    def __repr__(self) -> str:
        return repr({"name": self.name, "version": self.version, "state": self.state})

    @property
    def _version(self) -> str:
        return "" if self.version < 0 else str(self.version)

    def _call(self, function: Callable[..., Any], *args: Any) -> Any:
        try:
            return self._server._loop_thread().call(function, *args)
        except InferenceServerError as exc:
            raise translate(exc) from None

    # ---- inference ----------------------------------------------------------------------------

    def create_request(self, **kwargs: Any) -> InferenceRequest:
        kwargs.pop("model", None)
        return InferenceRequest(model=self, **kwargs)

    def infer(
        self,
        inference_request: InferenceRequest | None = None,
        raise_on_error: bool = True,
        **kwargs: Any,
    ) -> ResponseIterator:
        """Send a request; iterate its responses on this thread (one for most models, as many
        as the model sends for a decoupled one)."""
        request = inference_request or InferenceRequest(model=self, **kwargs)
        user_queue = request.response_queue
        if user_queue is not None and not isinstance(user_queue, queue.SimpleQueue):
            raise InvalidArgumentError("queue.SimpleQueue must be used for response iterator")
        responses: queue.SimpleQueue[Item] = queue.SimpleQueue()
        put: Callable[[Item], None] = responses.put
        if user_queue is not None:
            put = self._also_to(user_queue.put, put)
        cancel = self._submit(request, put, wait=True)
        return ResponseIterator(self, responses, raise_on_error, cancel)

    def async_infer(
        self,
        inference_request: InferenceRequest | None = None,
        raise_on_error: bool = True,
        **kwargs: Any,
    ) -> AsyncResponseIterator:
        """Send a request; iterate its responses with `async for` on the running loop."""
        request = inference_request or InferenceRequest(model=self, **kwargs)
        user_queue = request.response_queue
        if user_queue is not None and not isinstance(user_queue, asyncio.Queue):
            raise InvalidArgumentError("asyncio.Queue must be used for async response iterator")
        loop = asyncio.get_running_loop()
        caller = threading.get_ident()
        responses: asyncio.Queue[Item] = asyncio.Queue()

        def to_caller(deliver: Callable[[Any], None], value: Any) -> None:
            # Straight in when the core answered on the caller's own thread (loop lent).
            if threading.get_ident() == caller:
                deliver(value)
            else:
                loop.call_soon_threadsafe(deliver, value)

        def to_iterator(item: Item) -> None:
            to_caller(responses.put_nowait, item)

        put: Callable[[Item], None] = to_iterator

        if user_queue is not None:
            put = self._also_to(lambda r: to_caller(user_queue.put_nowait, r), put)
        cancel = self._submit(request, put, wait=False)
        return AsyncResponseIterator(self, responses, raise_on_error, cancel)

    def _also_to(
        self, user_put: Callable[[Any], None], put: Callable[[Item], None]
    ) -> Callable[[Item], None]:
        """`put`, and each response also into the caller's own queue as it arrives."""

        def both(item: Item) -> None:
            user_put(response_from(self, item, raise_on_error=False))
            put(item)

        return both

    def _submit(
        self, request: InferenceRequest, put: Callable[[Item], None], wait: bool
    ) -> Callable[[], None]:
        """Queue the request with the core (on this thread while the core's loop is idle, see
        loop.py; `wait`: block until it is rather than hand over); returns what cancels it."""
        core_request = request._to_core()
        core_loop = self._server._loop_thread()
        core = self._server._require_started()
        handle = _Handle()
        if wait:
            core_loop.call(_start, core, core_request, put, handle)
        else:
            core_loop.try_call(_start, core, core_request, put, handle)

        def cancel() -> None:
            core_loop.loop.call_soon_threadsafe(handle.cancel)

        return cancel

    # ---- what the model is --------------------------------------------------------------------

    def metadata(self) -> dict[str, Any]:
        core = self._server._require_started()
        result: dict[str, Any] = self._call(core.model_metadata, self.name, self._version)
        return result

    def ready(self) -> bool:
        core = self._server._require_started()
        return bool(self._call(core.model_ready, self.name, self._version))

    def config(self, config_version: int = 1) -> dict[str, Any]:
        core = self._server._require_started()
        config = self._call(core.model_config, self.name, self._version)
        return message_to_dict(config)

    def statistics(self) -> dict[str, Any]:
        core = self._server._require_started()
        stats = self._call(core.statistics, self.name, self._version)
        return {"model_stats": stats}

    def batch_properties(self) -> ModelBatchFlag:
        config = self.config()
        batching = int(config.get("max_batch_size", 0)) > 0
        return ModelBatchFlag.FIRST_DIM if batching else ModelBatchFlag.UNKNOWN

    def transaction_properties(self) -> ModelTxnPropertyFlag:
        core = self._server._require_started()
        decoupled = self._call(core.is_decoupled, self.name, self._version)
        return ModelTxnPropertyFlag.DECOUPLED if decoupled else ModelTxnPropertyFlag.ONE_TO_ONE


class _Handle:
    """What a request became on the loop (a future or a stream's task), for cancellation."""

    __slots__ = ("cancelled", "running")

    def __init__(self) -> None:
        self.running: asyncio.Future[Any] | None = None
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        if self.running is not None:
            self.running.cancel()


_CANCELLED = InferenceServerError(ErrorCode.CANCELLED, "Request was cancelled")


def _start(
    core: ServerCore, request: InferRequest, put: Callable[[Item], None], handle: _Handle
) -> None:
    """On the core's loop: queue the request and arrange for its responses to reach `put`."""
    if handle.cancelled:
        put((None, _CANCELLED, True))
        return
    try:
        if core.is_decoupled(request.model_name, request.model_version):
            stream = core.infer_stream(request, empty_final=True, mark_final=True)
            handle.running = asyncio.ensure_future(_drain(stream, put))
            return
        future = core.infer(request, CALLER)
    except InferenceServerError as exc:
        put((None, exc, True))
        return
    except Exception as exc:  # a bug below us: the caller must not wait forever
        put((None, internal(f"{type(exc).__name__}: {exc}"), True))
        return
    if future.done():
        _deliver(put, future)
    else:
        handle.running = future
        future.add_done_callback(lambda done: _deliver(put, done))


def _deliver(put: Callable[[Item], None], future: asyncio.Future[InferResponse]) -> None:
    if future.cancelled():
        put((None, _CANCELLED, True))
        return
    error = future.exception()
    if error is None:
        put((future.result(), None, True))
    elif isinstance(error, InferenceServerError):
        put((None, error, True))
    else:
        put((None, internal(f"{type(error).__name__}: {error}"), True))


async def _drain(stream: AsyncIterator[InferResponse], put: Callable[[Item], None]) -> None:
    """A decoupled request's responses, each handed over as the model sends it."""
    try:
        async for response in stream:
            final = bool(response.parameters.get("triton_final_response"))
            put((response, None, final))
            if final:
                return
        put((None, None, True))
    except InferenceServerError as exc:
        put((None, exc, True))
    except asyncio.CancelledError:
        put((None, _CANCELLED, True))
    except Exception as exc:
        put((None, internal(f"{type(exc).__name__}: {exc}"), True))
