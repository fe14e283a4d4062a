"""Model instances: each owns a thread that executes whole batches on its backend instance.

The thread assembles the batch (one numpy concatenation per input), executes it, and splits the
outputs back into per-request views, so none of that work runs on the event loop. It then hands
the finished batch to the loop in one `call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from oceanus.core.backend import (
    BackendInstance,
    BatchInstance,
    InstanceSpec,
    RequestInstance,
    RequestsResult,
    ResponseStream,
)
from oceanus.core.clock import MONOTONIC, Clock
from oceanus.core.errors import InferenceServerError, internal
from oceanus.core.types import InferRequest

log = logging.getLogger("oceanus.core.instance")
# An instance's mean execution time before it has one (nothing runs inline until then).
_UNKNOWN = float("inf")


@dataclass(slots=True, eq=False)
class Job:
    """One request waiting in (or leaving) a scheduler queue."""

    request: InferRequest
    inputs: dict[str, np.ndarray]
    rows: int
    future: asyncio.Future[Any]
    enqueued_ns: int = 0
    deadline_ns: int = 0  # 0: no timeout
    priority: int = 0
    seq: int = 0
    delayed: bool = False
    started_ns: int = 0
    # Per-request path (backends with execute_requests): this request's own error response
    # (its execution counts as a success, as in Triton) and, for decoupled models, the stream
    # its responses go to.
    response_error: InferenceServerError | None = None
    stream: ResponseStream | None = None
    # Per-request path: the parameters the model set on this request's response.
    response_parameters: dict[str, Any] | None = None

    def cancelled(self) -> bool:
        # A decoupled request's caller may leave after execute() returned (core/model.py).
        return self.future.cancelled() or (self.stream is not None and self.stream.cancelled())


@dataclass(slots=True)
class BatchResult:
    outputs: list[dict[str, np.ndarray]] = field(default_factory=list)  # one per job
    error: InferenceServerError | None = None
    started_ns: int = 0
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0


# Batches whose mean execution time is below this run on the event loop instead of the instance's
# thread: for a model this cheap (a tiny ONNX graph) the two thread hops cost more than the
# execution, and under load each hop waits for a CPU (docs/measurements.md, "Cheap models").
INLINE_LIMIT_NS = 100_000

BatchDone = Callable[["InstanceThread", list[Job], BatchResult], None]


class ThreadBatches:
    """How many batches execute on instance threads right now, process-wide. Changed on the
    event loop only; busy polling (frontends/http/busy_poll.py) reads it so as not to take a CPU
    from a computing model."""

    executing = 0


class InstanceThread:
    """A backend instance and the thread that executes batches on it."""

    def __init__(
        self,
        spec: InstanceSpec,
        instance: BackendInstance,
        batched: bool,
        loop: asyncio.AbstractEventLoop,
        clock: Clock = MONOTONIC,
    ) -> None:
        self.spec = spec
        # Compute times (statistics, traces) come from the scheduler's clock.
        self._now_ns = clock.now_ns
        self.instance = instance
        self._batched = batched
        self._loop = loop
        self._on_done: BatchDone | None = None
        self._batches: queue.SimpleQueue[list[list[Job]] | None] = queue.SimpleQueue()
        # Batches of the group being handed back that come after the one being delivered: the
        # scheduler takes the instance as idle only when this is 0.
        self.group_left = 0
        # The instance under the type it executes as (exactly one is set), checked once here
        # rather than per batch.
        self._request_instance = instance if isinstance(instance, RequestInstance) else None
        self._batch_instance = instance if isinstance(instance, BatchInstance) else None
        # Whether a group's executions can all be started before the first is awaited: only
        # where the backend says so (by default `start_requests` runs the execution there).
        self._pipelined = (
            self._request_instance is not None
            and type(self._request_instance).start_requests is not RequestInstance.start_requests
        )
        # Loop-driven: batches start and end on the event loop; the thread stays idle.
        self._on_loop = self._request_instance is not None and self._request_instance.loop_driven
        self._outstanding = 0  # loop-driven batches submitted and not done
        if self._request_instance is None and self._batch_instance is None:
            raise TypeError(
                f"{type(instance).__name__} is neither a BatchInstance nor a RequestInstance"
            )
        # Mean batch execution time (EWMA, ns; unknown until the second batch: the first two run
        # on the thread). Never inline for per-request backends (a Python model runs user code),
        # for a backend that says it is not loop-safe, nor on GPUs (a CUDA context is bound to
        # the instance's thread).
        self.mean_ns = _UNKNOWN
        self._executions = 0
        batch_instance = self._batch_instance
        inline = batch_instance is not None and batch_instance.loop_safe and spec.kind == "CPU"
        self.inline_limit_ns = INLINE_LIMIT_NS if inline else 0
        self._thread = threading.Thread(target=self._run, name=spec.name, daemon=True)

    def start(self, on_done: BatchDone) -> None:
        self._on_done = on_done
        self._thread.start()

    def submit(self, batch: list[Job]) -> None:
        self.submit_group([batch])

    def submit_group(self, batches: list[list[Job]]) -> None:
        """Execute the batches one after another (each its own execution) and hand them back
        together: one wake-up of the thread and one of the loop for the group, where a batch
        each would pay two (the cost that bounds a one-request-per-execute model under load)."""
        if self._on_loop:
            instance = self._request_instance
            assert instance is not None
            self._outstanding += len(batches)
            for batch in batches:
                done = functools.partial(self._loop_done, batch, self._now_ns())
                try:
                    instance.submit_on_loop(batch, done)
                except Exception as exc:
                    done(exc)
            return
        ThreadBatches.executing += 1
        self._batches.put(batches)

    def _loop_done(
        self, batch: list[Job], submitted: int, answer: RequestsResult | Exception
    ) -> None:
        """A loop-driven batch's end, on the loop: the instance is idle again (for the
        scheduler) once every batch it was handed is done."""
        run: Callable[[], RequestsResult]
        if isinstance(answer, Exception):
            run = functools.partial(_raise, answer)
        else:
            run = functools.partial(_same, answer)
        result = self._requests_result(batch, submitted, run)
        now = self._now_ns()
        took = result.input_ns + result.infer_ns + result.output_ns or now - submitted
        self._note_time(took)
        # It waited behind the batches sent before it: queue time, as on the thread.
        result.started_ns = max(submitted, now - took)
        for job in batch:
            job.started_ns = max(job.started_ns, result.started_ns)
        self._outstanding -= 1
        self.group_left = self._outstanding
        assert self._on_done is not None
        self._on_done(self, batch, result)

    def stop(self, wait: bool = True) -> None:
        self._batches.put(None)
        if wait and self._thread.is_alive():
            self._thread.join()
        self.instance.close()

    def _run(self) -> None:
        while True:
            batches = self._batches.get()
            if batches is None:
                return
            if len(batches) > 1 and self._pipelined:
                assert self._request_instance is not None
                done = self._execute_request_group(self._request_instance, batches)
            else:
                done = [(batch, self.execute_now(batch)) for batch in batches]
            try:
                self._loop.call_soon_threadsafe(self._executed, done)
            except RuntimeError:  # loop closed during shutdown
                return

    def _executed(self, done: list[tuple[list[Job], BatchResult]]) -> None:
        ThreadBatches.executing -= 1
        assert self._on_done is not None
        last = len(done) - 1
        for index, (batch, result) in enumerate(done):
            if index:  # it waited on this thread for the ones before it: queue time, as in Triton
                for job in batch:
                    job.started_ns = result.started_ns
            self.group_left = last - index
            self._on_done(self, batch, result)

    @property
    def runs_inline(self) -> bool:
        """Whether the next batch should run on the event loop (the model is that cheap)."""
        return self.mean_ns < self.inline_limit_ns

    def execute_now(self, batch: list[Job]) -> BatchResult:
        """Execute on the calling thread, updating the mean execution time."""
        result = self._execute(batch)  # its started_ns: one clock read less per execution
        self._note_time(self._now_ns() - result.started_ns)
        return result

    def _execute_request_group(
        self, instance: RequestInstance, batches: list[list[Job]]
    ) -> list[tuple[list[Job], BatchResult]]:
        """Start every execution of the group, then wait for each in turn: each is still its
        own execution, and one that fails to start fails alone."""
        waits: list[tuple[list[Job], Callable[[], RequestsResult]]] = []
        for batch in batches:
            try:
                wait = instance.start_requests(batch)
            except Exception as exc:  # reported by _requests_result, as any execution's error
                wait = functools.partial(_raise, exc)
            waits.append((batch, wait))
        done = []
        for batch, wait in waits:
            started = self._now_ns()  # this one runs once the one before it is done
            result = self._requests_result(batch, started, wait)
            self._note_time(self._now_ns() - started)
            done.append((batch, result))
        return done

    def _note_time(self, took: int) -> None:
        self._executions += 1
        if self._executions > 1:  # the first run warms the framework up: not representative
            mean = self.mean_ns
            # A run counts at most twice the mean: one preempted run (frequent on shared cores)
            # must not send the next batches to the thread, while a model that really got
            # slower still raises the mean by 20 % per batch.
            if mean == _UNKNOWN:
                self.mean_ns = took
            else:  # (no float() or min() call: this runs once per execution)
                limit = 2 * mean
                self.mean_ns = 0.8 * mean + 0.2 * (took if took < limit else limit)

    def _execute(self, batch: list[Job]) -> BatchResult:
        if self._request_instance is not None:
            return self._execute_requests(self._request_instance, batch)
        instance = self._batch_instance
        assert instance is not None
        result = BatchResult(started_ns=self._now_ns())
        try:
            inputs = _assemble(batch)
            assembled = self._now_ns()
            outputs = instance.execute(inputs)
            executed = self._now_ns()
            result.outputs = self._split(batch, outputs)
            done = self._now_ns()
        except InferenceServerError as exc:
            result.error = exc
            return result
        except Exception as exc:  # a backend failure must never kill the thread
            log.exception("instance %s failed to execute a batch", self.spec.name)
            result.error = internal(
                f"Failed to process the request(s) for model '{self.spec.name}', message: "
                f"{type(exc).__name__}: {exc}"
            )
            return result
        result.input_ns = assembled - result.started_ns
        result.infer_ns = executed - assembled
        result.output_ns = done - executed
        return result

    def _execute_requests(self, instance: RequestInstance, batch: list[Job]) -> BatchResult:
        """The per-request path: the backend gets the requests themselves and answers each."""
        return self._requests_result(
            batch, self._now_ns(), functools.partial(instance.execute_requests, batch)
        )

    def _requests_result(
        self, batch: list[Job], started_ns: int, run: Callable[[], RequestsResult]
    ) -> BatchResult:
        result = BatchResult(started_ns=started_ns)
        try:
            done = run()
        except InferenceServerError as exc:
            result.error = exc
            return result
        except Exception as exc:
            log.exception("instance %s failed to execute a batch", self.spec.name)
            result.error = internal(
                f"Failed to process the request(s) for model '{self.spec.name}', message: "
                f"{type(exc).__name__}: {exc}"
            )
            return result
        outputs: list[dict[str, np.ndarray]] = []
        if done.parameters is not None:
            for job, parameters in zip(batch, done.parameters, strict=True):
                job.response_parameters = parameters
        for job, answer in zip(batch, done.outputs, strict=True):
            if isinstance(answer, InferenceServerError):
                job.response_error = answer
                outputs.append({})
            else:
                outputs.append(answer)
        result.outputs = outputs
        result.input_ns = done.input_ns
        result.infer_ns = done.infer_ns
        result.output_ns = done.output_ns
        return result

    def _split(
        self, batch: list[Job], outputs: dict[str, np.ndarray]
    ) -> list[dict[str, np.ndarray]]:
        if len(batch) == 1:
            return [outputs]
        total = sum(job.rows for job in batch)
        for name, array in outputs.items():
            if array.ndim == 0 or array.shape[0] != total:
                raise internal(
                    f"output '{name}' of batch size {total} has shape {list(array.shape)}: "
                    "its first dimension must be the batch size"
                )
        per_job: list[dict[str, np.ndarray]] = []
        offset = 0
        for job in batch:
            end = offset + job.rows
            per_job.append({name: array[offset:end] for name, array in outputs.items()})
            offset = end
        return per_job


def _raise(exc: Exception) -> RequestsResult:
    raise exc


def _same(result: RequestsResult) -> RequestsResult:
    return result


def _assemble(batch: list[Job]) -> dict[str, np.ndarray]:
    if len(batch) == 1:
        return batch[0].inputs
    return {name: np.concatenate([job.inputs[name] for job in batch]) for name in batch[0].inputs}
