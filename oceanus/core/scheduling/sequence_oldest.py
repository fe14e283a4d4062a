"""The sequence batcher's `oldest` strategy: batches form across sequences, dynamically.

Semantics (core sequence_batch_scheduler.cc `OldestSequenceBatch`; server
docs/user_guide/architecture.md, "Oldest"):
- each instance holds `max_candidate_sequences` sequences (default: max(max_batch_size, 1));
  further sequences wait in the backlog, as with the direct strategy;
- a candidate sequence has at most one request in flight: its next request becomes ready when
  the previous one has executed;
- an idle instance batches its ready requests, oldest first, with the dynamic batcher's rules:
  up to max_batch_size, sent at once when a `preferred_batch_size` (default max_batch_size)
  can be formed, else after the oldest ready request waited `max_queue_delay_microseconds`;
- `preserve_ordering` returns responses in the order requests entered batches.
Control tensors and implicit state are added as with the direct strategy
(core/scheduling/sequence.py).
"""

from __future__ import annotations

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.core.clock import MONOTONIC, Clock
from oceanus.core.errors import InferenceServerError
from oceanus.core.observability.statistics import ModelStatistics
from oceanus.core.scheduling.dynamic_batch import JobDone, _same_shapes
from oceanus.core.scheduling.instance import BatchResult, InstanceThread, Job
from oceanus.core.scheduling.sequence import SequenceScheduler, _Sequence, _Slot


class OldestSequenceScheduler(SequenceScheduler):
    """The `oldest` sequence batcher of one model version (on the event loop)."""

    def __init__(
        self,
        config: mc.ModelConfig,
        workers: list[InstanceThread],
        stats: ModelStatistics,
        on_job_done: JobDone,
        clock: Clock = MONOTONIC,
    ) -> None:
        super().__init__(config, workers, stats, on_job_done, clock)
        oldest = config.sequence_batching.oldest
        candidates = oldest.max_candidate_sequences or max(config.max_batch_size, 1)
        self._slots = {
            worker: [_Slot(worker, index) for index in range(candidates)] for worker in workers
        }
        self._max_batch = max(config.max_batch_size, 1)
        self._preferred = sorted(set(oldest.preferred_batch_size)) or [self._max_batch]
        self._max_preferred = self._preferred[-1]
        self._delay_ns = oldest.max_queue_delay_microseconds * 1000
        self._preserve_ordering = oldest.preserve_ordering
        # Order in which requests entered a batch, for preserve_ordering (requests finished
        # without executing, cancelled or unloaded, are answered at once).
        self._batch_order: dict[int, int] = {}
        self._next_batched = 0

    def _dispatch(self) -> None:
        if not self._queued:
            return
        now = self._now_ns()
        for worker in list(self._idle):
            ready: list[tuple[int, _Sequence]] = []
            for slot in self._slots[worker]:
                sequence = slot.sequence
                if sequence is None or sequence.busy:
                    continue
                self._drop_cancelled_of(sequence, now)
                if sequence.jobs:
                    # Ready since it arrived or since its sequence's previous request finished.
                    ready.append((max(sequence.jobs[0].enqueued_ns, sequence.last_ns), sequence))
            if not ready:
                continue
            ready.sort(key=lambda entry: entry[0])
            chosen = self._choose(ready, now)
            if not chosen:
                continue
            batch: list[Job] = []
            for sequence in chosen:
                job = sequence.jobs.popleft()
                sequence.busy = True
                self._running[id(job)] = sequence
                self._add_controls(job, sequence)
                if self._preserve_ordering:
                    self._batch_order[id(job)] = self._next_batched
                    self._next_batched += 1
                batch.append(job)
            self._idle.remove(worker)
            self._launch(worker, batch)
            if not self._queued:
                return

    def _choose(self, ready: list[tuple[int, _Sequence]], now: int) -> list[_Sequence]:
        """The dynamic batcher's choice over the ready heads (core/scheduling/dynamic_batch.py's
        rules)."""
        chosen: list[_Sequence] = []
        first: Job | None = None
        rows = 0
        best_cut = 0
        send_now = False
        for _, sequence in ready:
            job = sequence.jobs[0]
            self._prepare(job, sequence)
            if first is not None:
                if not _same_shapes(first, job):
                    send_now = True
                    break
                if rows + job.rows > self._max_preferred and not best_cut:
                    best_cut = len(chosen)
                if rows + job.rows > self._max_batch:
                    send_now = True
                    break
            else:
                first = job
            chosen.append(sequence)
            rows += job.rows
            if rows in self._preferred:
                best_cut = len(chosen)
        oldest = ready[0][0]
        delay_exceeded = now - oldest >= self._delay_ns
        if best_cut and not delay_exceeded:
            return chosen[:best_cut]
        if send_now or rows >= self._max_preferred or delay_exceeded:
            return chosen
        self._wake_at(oldest + self._delay_ns)
        return []

    def _finish(
        self,
        job: Job,
        result: BatchResult | None,
        now: int,
        error: InferenceServerError | None,
        index: int = 0,
    ) -> None:
        order = self._batch_order.pop(id(job), None)
        outputs: dict[str, np.ndarray] | None = (
            result.outputs[index] if result is not None and error is None else None
        )
        if order is None:
            self._on_job_done(job, outputs, result, now, error)
            return
        self._held[order] = (job, outputs, result, now, error)
        while self._next_to_deliver in self._held:
            self._on_job_done(*self._held.pop(self._next_to_deliver))
            self._next_to_deliver += 1
