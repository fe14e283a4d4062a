"""The scheduler of one model version: queues, the dynamic batcher, and dispatch to instances.

It runs on the event loop and never blocks: it only decides which queued requests form the next
batch and which idle instance gets it. Instances execute on their own threads and report back
through `_on_batch_done`, also on the loop, where responses and statistics are completed.

Semantics follow Triton's dynamic batcher (server docs/user_guide/batcher.md):
- a batch is formed only when an instance is free, so while all are busy the queue grows into the
  next batch;
- the largest preferred batch size that can be formed is sent at once; otherwise the batcher waits
  up to `max_queue_delay_microseconds` (from the oldest request) for the batch to fill, then sends
  what it has, up to max_batch_size;
- requests whose non-batch shapes differ are never merged; the batch stops at the first one;
- priority levels are separate queues served highest priority (lowest number) first, each with its
  queue policy (max_queue_size, timeouts with REJECT or DELAY).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.core.clock import MONOTONIC, Clock, Timer
from oceanus.core.errors import ErrorCode, InferenceServerError, unavailable
from oceanus.core.observability.statistics import ModelStatistics
from oceanus.core.scheduling.instance import BatchResult, InstanceThread, Job
from oceanus.core.scheduling.rate_limiter import ModelGate

log = logging.getLogger("oceanus.core.scheduler")

# Triton's test hook: hold the first batch until this many requests are queued.
DELAY_SCHEDULER_ENV = "TRITONSERVER_DELAY_SCHEDULER"

# The most one-request executions handed to an instance thread at once: enough to spread its
# two wake-ups over many requests, few enough that the first answer of a group waits little.
# Only for instances whose mean execution is below GROUP_COST_LIMIT_NS: for a slower model the
# hand-off is noise, and a group would keep its requests from an instance that frees up first.
GROUP_LIMIT = 8
GROUP_COST_LIMIT_NS = 500_000

# (job, its outputs, the batch's timings, completion time, error)
JobDone = Callable[
    [Job, "dict[str, np.ndarray] | None", BatchResult | None, int, InferenceServerError | None],
    None,
]
Held = tuple[
    Job, "dict[str, np.ndarray] | None", BatchResult | None, int, InferenceServerError | None
]


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    max_queue_size: int = 0
    default_timeout_us: int = 0
    allow_timeout_override: bool = False
    delay_on_timeout: bool = False

    @classmethod
    def from_proto(cls, policy: mc.ModelQueuePolicy) -> QueuePolicy:
        return cls(
            max_queue_size=policy.max_queue_size,
            default_timeout_us=policy.default_timeout_microseconds,
            allow_timeout_override=policy.allow_timeout_override,
            delay_on_timeout=policy.timeout_action == mc.ModelQueuePolicy.DELAY,
        )


class Scheduler:
    """Queues requests of one model version and dispatches batches to its instances."""

    def __init__(
        self,
        config: mc.ModelConfig,
        workers: list[InstanceThread],
        stats: ModelStatistics,
        on_job_done: JobDone,
        clock: Clock = MONOTONIC,
    ) -> None:
        self._name = config.name
        # Queue times, delays and timeouts are read from `clock` (tests drive it by hand).
        self._clock = clock
        self._now_ns = clock.now_ns
        self._workers = workers
        self._idle: list[InstanceThread] = list(reversed(workers))
        self._stats = stats
        self._on_job_done = on_job_done
        self._max_batch = config.max_batch_size
        self._dynamic = config.HasField("dynamic_batching")
        batching = config.dynamic_batching
        self._preferred = sorted(set(batching.preferred_batch_size))
        self._max_preferred = self._preferred[-1] if self._preferred else self._max_batch
        self._delay_ns = batching.max_queue_delay_microseconds * 1000
        self._preserve_ordering = batching.preserve_ordering
        levels = batching.priority_levels if self._dynamic else 0
        self._levels = max(levels, 1)
        self._default_level = batching.default_priority_level if levels else 1
        default_policy = QueuePolicy.from_proto(batching.default_queue_policy)
        self._policies = [default_policy] * (self._levels + 1)
        for level, policy in batching.priority_queue_policy.items():
            if 1 <= level <= self._levels:
                self._policies[level] = QueuePolicy.from_proto(policy)
        # queues[level] and delayed[level], index 0 unused so levels read as in the config
        self._queues: list[deque[Job]] = [deque() for _ in range(self._levels + 1)]
        self._delayed: list[deque[Job]] = [deque() for _ in range(self._levels + 1)]
        self._queued = 0
        self._executing = 0
        self._next_seq = 0
        self._next_to_deliver = 0
        self._held: dict[int, Held] = {}
        self._timer: Timer | None = None
        self._timer_at_ns = 0
        self._delay_count = (
            int(os.environ.get(DELAY_SCHEDULER_ENV, "0") or 0) if self._dynamic else 0
        )
        self._closed = False
        # Without dynamic batching nothing can join a request's batch: a cheap model's lone
        # request executes inside enqueue (see there) instead of a loop iteration later.
        self._in_place_allowed = not self._dynamic
        # ... and a queue of such requests goes to an instance thread several at a time
        # (`_launch_group`), each still its own execution.
        self._groups_allowed = not self._dynamic or self._max_batch == 0
        # The rate limiter's view of the instances (--rate-limit=execution_count), if on.
        self._gate: ModelGate[InstanceThread] | None = None
        self._loop = asyncio.get_running_loop()
        for worker in workers:
            worker.start(self._on_batch_done)

    def attach_gate(self, gate: ModelGate[InstanceThread] | None) -> None:
        """Run every batch through the rate limiter (core/scheduling/rate_limiter.py): a formed
        batch waits, still counted as queued time, until its instance's resources are allocated."""
        self._gate = gate
        if gate is not None:
            self._in_place_allowed = False
            self._groups_allowed = False  # the rate limiter allocates per execution

    # ---- queue side -------------------------------------------------------------------------

    @property
    def pending_count(self) -> int:
        """Requests queued or executing (Triton's nv_inference_pending_request_count)."""
        return self._queued + self._executing

    @property
    def queued_count(self) -> int:
        return self._queued

    def enqueue(self, job: Job) -> None:
        """Queue one request; raises UNAVAILABLE when its priority queue is full."""
        if self._closed:
            raise unavailable("model is being unloaded")
        level = self._level_of(job)
        policy = self._policies[level]
        if policy.max_queue_size and len(self._queues[level]) + len(self._delayed[level]) >= (
            policy.max_queue_size
        ):
            request_id = job.request.id or "<id_unknown>"
            raise unavailable(f"[request id: {request_id}] Exceeds maximum queue size")
        job.priority = level
        job.enqueued_ns = self._now_ns()
        timeout_us = policy.default_timeout_us
        if policy.allow_timeout_override:
            # A request may shorten the default timeout, never lengthen it (as in Triton).
            requested = job.request.parameters.get("timeout")
            if isinstance(requested, int) and requested > 0:
                timeout_us = min(timeout_us, requested) if timeout_us else requested
        job.deadline_ns = job.enqueued_ns + timeout_us * 1000 if timeout_us else 0
        job.seq = self._next_seq
        self._next_seq += 1
        self._queued += 1
        if (
            self._in_place_allowed
            and self._queued == 1
            and self._idle
            and self._idle[-1].runs_inline
        ):
            # Nothing can join its batch and nothing waits before it: a cheap model executes
            # it now, inside this call, instead of a loop iteration later.
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "request '%s' for '%s' executes in place",
                    job.request.id or "<id_unknown>",
                    self._name,
                )
            self._launch(self._idle.pop(), [job], in_place=True)
            return
        self._queues[level].append(job)
        if log.isEnabledFor(logging.DEBUG):  # --log-verbose 1: each request's path
            log.debug(
                "request '%s' for '%s' queued at priority %d (%d queued)",
                job.request.id or "<id_unknown>",
                self._name,
                level,
                self._queued,
            )
        self._dispatch()

    def _level_of(self, job: Job) -> int:
        if self._levels == 1:
            return 1
        priority = job.request.parameters.get("priority", 0)
        if not isinstance(priority, int) or priority <= 0 or priority > self._levels:
            return self._default_level
        return priority

    def _drop_cancelled(self, now: int) -> None:
        """Remove queued requests whose futures are already done (cancelled by their client).

        Runs before each batch is formed, so a frontend just cancels the future of a client that
        left: no per-request done-callback, which would cost a loop callback per request."""
        for queues in (self._queues, self._delayed):
            for level, queue in enumerate(queues):
                if not any(job.future.done() for job in queue):
                    continue
                for job in queue:
                    if job.future.done():
                        self._queued -= 1
                        self._finish(job, None, now, None)
                queues[level] = deque(job for job in queue if not job.future.done())

    # ---- batch formation --------------------------------------------------------------------

    def _dispatch(self) -> None:
        while self._idle and self._queued:
            batch = self._form_batch()
            if not batch:
                return
            worker = self._take_idle()
            if (
                self._groups_allowed
                and self._queued > 1
                and worker.mean_ns < GROUP_COST_LIMIT_NS
                and not worker.runs_inline
            ):
                self._launch_group(worker, batch)
            else:
                self._launch(worker, batch)

    def _launch_group(self, worker: InstanceThread, first: list[Job]) -> None:
        """One request per execution, and more queued: hand the instance its share of the queue
        (spread over the idle instances, at most GROUP_LIMIT) as executions in one hand-off."""
        share = min(GROUP_LIMIT, -(-self._queued // (len(self._idle) + 1)))
        group = [first]
        # The jobs taken so far are out of the queues but still counted in `_queued`.
        while len(group) < share and self._queued > len(group):
            queue, job = next(self._ordered())
            group.append([self._pop(queue, job)])
        if len(group) == 1:
            self._launch(worker, first)
            return
        now = self._now_ns()
        for batch in group:
            self._queued -= len(batch)
            self._executing += len(batch)
            for job in batch:
                job.started_ns = now
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "%d executions of one request each handed to instance %s of '%s' at once",
                len(group),
                worker.spec.name,
                self._name,
            )
        worker.submit_group(group)

    def _take_idle(self) -> InstanceThread:
        return self._idle.pop() if self._gate is None else self._gate.take_idle(self._idle)

    def _launch(self, worker: InstanceThread, batch: list[Job], in_place: bool = False) -> None:
        """Send a formed batch (its jobs already out of the queue, still counted in it) to an
        idle worker; `in_place`: a cheap model's lone request executes in this call."""
        self._queued -= len(batch)
        self._executing += len(batch)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "batch of %d request(s), %d row(s) formed for '%s' on instance %s",
                len(batch),
                sum(job.rows for job in batch),
                self._name,
                worker.spec.name,
            )
        if self._gate is not None:
            self._gate.stage(worker, batch, self._run_batch)
        else:
            self._run_batch(worker, batch, in_place)

    def _run_batch(self, worker: InstanceThread, batch: list[Job], in_place: bool = False) -> None:
        now = self._now_ns()
        for job in batch:
            job.started_ns = now
        if in_place:
            # What this execution's completion dispatches goes through the loop (call_soon
            # below), so a queue never drains in one call without serving I/O between batches.
            self._execute_inline(worker, batch)
        elif worker.runs_inline:
            self._loop.call_soon(self._execute_inline, worker, batch)
        else:
            worker.submit(batch)

    def _execute_inline(self, worker: InstanceThread, batch: list[Job]) -> None:
        """A cheap model's batch, on the loop (after the callbacks already ready, so requests
        read in this loop iteration can still join the next batch)."""
        self._on_batch_done(worker, batch, worker.execute_now(batch), inline=True)

    def _ordered(self) -> Iterator[tuple[deque[Job], Job]]:
        for level in range(1, self._levels + 1):
            for queue in (self._queues[level], self._delayed[level]):
                yield from ((queue, job) for job in queue)

    def _expire(self, now: int) -> None:
        """Reject or delay requests whose queue timeout passed."""
        for level in range(1, self._levels + 1):
            queue = self._queues[level]
            if not any(job.deadline_ns and job.deadline_ns <= now for job in queue):
                continue
            keep: deque[Job] = deque()
            for job in queue:
                if job.deadline_ns and job.deadline_ns <= now:
                    if self._policies[level].delay_on_timeout:
                        job.delayed = True
                        self._delayed[level].append(job)
                        continue
                    self._queued -= 1
                    self._finish(job, None, now, unavailable("Request timeout expired"))
                else:
                    keep.append(job)
            self._queues[level] = keep

    def _form_batch(self) -> list[Job]:
        now = self._now_ns()
        self._drop_cancelled(now)
        self._expire(now)
        if not self._queued:
            return []
        if self._delay_count:
            if self._queued < self._delay_count:
                return []
            self._delay_count = 0
        if not self._dynamic or self._max_batch == 0:
            queue, job = next(self._ordered())
            return [self._pop(queue, job)]
        return self._form_dynamic_batch(now)

    def _form_dynamic_batch(self, now: int) -> list[Job]:
        """Triton's batch formation (dynamic_batch_scheduler.cc, GetDynamicBatch) in one pass.

        Walk the queue in priority order, growing the batch up to max_batch_size; remember the
        last cut that makes a preferred size (or the cut before the batch outgrows the largest
        preferred size). Before the oldest request's queue delay runs out, send up to that cut;
        once it has run out (or with no delay), or when the batch cannot grow, send it all.
        """
        chosen: list[tuple[deque[Job], Job]] = []
        rows = 0
        best_cut = 0
        send_now = False
        for queue, job in self._ordered():
            if chosen:
                if not _same_shapes(chosen[0][1], job):
                    send_now = True
                    break
                if rows + job.rows > self._max_preferred and not best_cut:
                    best_cut = len(chosen)
                if rows + job.rows > self._max_batch:
                    send_now = True
                    break
            chosen.append((queue, job))
            rows += job.rows
            if rows in self._preferred:
                best_cut = len(chosen)
        oldest = min(job.enqueued_ns for _, job in chosen)
        delay_exceeded = now - oldest >= self._delay_ns
        if best_cut and not delay_exceeded:
            chosen = chosen[:best_cut]
        elif not (send_now or rows >= self._max_preferred or delay_exceeded):
            self._wake_at(oldest + self._delay_ns)
            return []
        return [self._pop(queue, job) for queue, job in chosen]

    def _pop(self, queue: deque[Job], job: Job | None = None) -> Job:
        if job is None or (queue and queue[0] is job):
            return queue.popleft()
        queue.remove(job)
        return job

    def _wake_at(self, at_ns: int) -> None:
        if self._timer is not None and self._timer_at_ns <= at_ns:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at_ns = at_ns
        self._timer = self._clock.call_at(at_ns, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._dispatch()

    # ---- completion -------------------------------------------------------------------------

    def _on_batch_done(
        self, worker: InstanceThread, batch: list[Job], result: BatchResult, inline: bool = False
    ) -> None:
        now = self._now_ns()
        self._executing -= len(batch)
        if worker.group_left == 0:  # the last (or only) batch the instance was handed
            self._idle.append(worker)
            if self._gate is not None:
                self._gate.release(worker)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "instance %s executed a batch of %d for '%s' in %d us%s%s",
                worker.spec.name,
                len(batch),
                self._name,
                result.infer_ns // 1000,
                " on the event loop" if inline else "",
                f" and failed: {result.error.message}" if result.error else "",
            )
        # A failed execution still counts as one, as in Triton.
        # (a lone request's rows without a generator: most executions on the loop are one)
        rows = batch[0].rows if len(batch) == 1 else sum(job.rows for job in batch)
        self._stats.record_execution(rows, result.input_ns, result.infer_ns, result.output_ns)
        for index, job in enumerate(batch):
            self._finish(job, result, now, result.error, index)
        if not self._closed:
            self._dispatch()

    def _finish(
        self,
        job: Job,
        result: BatchResult | None,
        now: int,
        error: InferenceServerError | None,
        index: int = 0,
    ) -> None:
        outputs = result.outputs[index] if result is not None and error is None else None
        if not self._preserve_ordering:
            self._on_job_done(job, outputs, result, now, error)
            return
        self._held[job.seq] = (job, outputs, result, now, error)
        while self._next_to_deliver in self._held:
            self._on_job_done(*self._held.pop(self._next_to_deliver))
            self._next_to_deliver += 1

    def close(self) -> None:
        """Stop accepting work and fail whatever is still queued."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        now = self._now_ns()
        unloading = InferenceServerError(ErrorCode.UNAVAILABLE, "model is being unloaded")
        for batch in self._gate.close() if self._gate is not None else []:
            self._executing -= len(batch)
            for job in batch:
                self._finish(job, None, now, unloading)
        for queues in (self._queues, self._delayed):
            for queue in queues:
                while queue:
                    self._queued -= 1
                    self._finish(
                        queue.popleft(),
                        None,
                        now,
                        InferenceServerError(ErrorCode.UNAVAILABLE, "model is being unloaded"),
                    )

    def stop_workers(self) -> None:
        for worker in self._workers:
            worker.stop()


def _same_shapes(a: Job, b: Job) -> bool:
    for name, array in a.inputs.items():
        other = b.inputs.get(name)
        if other is None or other.shape[1:] != array.shape[1:]:
            return False
    return True
