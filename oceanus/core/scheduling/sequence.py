"""Triton's sequence batcher (`sequence_batching`), direct strategy, for stateful models.

Semantics (server docs/user_guide/architecture.md, "Stateful Models"; docs/sequence-batching.md):
- every request carries a correlation ID (`sequence_id`, non-zero integer or non-empty string)
  and batch size 1; the first request of a sequence has `sequence_start`, the last `sequence_end`;
- a sequence is bound to one batch slot of one instance from its start until its end (or until
  it has been idle for `max_sequence_idle_microseconds`); a sequence that finds no free slot
  waits in a backlog until one is released;
- a slot holds one request at a time, so a sequence's requests run in order, one per batch; the
  ready slots of an instance are batched together when the instance is idle (requests whose
  non-batch shapes differ wait for a later batch);
- before a batch runs, each request gets the configured control tensors (START, END, READY,
  CORRID), shaped [1, 1] (or [1] when max_batch_size is 0).

Differences from Triton: empty slots are not padded into the batch (Triton's direct strategy runs
a batch as large as the highest occupied slot, READY = 0 for the empty ones): a batch holds only
ready requests, so a request's row is not its slot number. The `oldest` strategy and implicit
state are refused at load (core/repository/model_config.py).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.core.clock import MONOTONIC, Clock, Timer
from oceanus.core.errors import ErrorCode, InferenceServerError, invalid_arg, unavailable
from oceanus.core.observability.statistics import ModelStatistics
from oceanus.core.scheduling.dynamic_batch import JobDone, Scheduler, _same_shapes
from oceanus.core.scheduling.implicit_state import StateKeeper, States
from oceanus.core.scheduling.instance import BatchResult, InstanceThread, Job

log = logging.getLogger("oceanus.core.sequence")

Control = mc.ModelSequenceBatching.Control
CorrelationId = int | str


@dataclass(eq=False, slots=True)
class _Slot:
    worker: InstanceThread
    index: int
    sequence: _Sequence | None = None


@dataclass(eq=False, slots=True)
class _Sequence:
    corrid: CorrelationId
    jobs: deque[Job] = field(default_factory=deque)
    slot: _Slot | None = None
    busy: bool = False  # one of its requests is executing
    ended: bool = False  # its END request is queued or executing
    last_ns: int = 0
    states: States | None = (
        None  # implicit state (core/scheduling/implicit_state.py); None: initial
    )


@dataclass(frozen=True, slots=True)
class _ControlSpec:
    name: str
    kind: int
    dtype: np.dtype[Any] | None  # None: BYTES (a string CORRID)
    values: tuple[object, object] = (0, 1)


def _control_specs(config: mc.ModelConfig) -> list[_ControlSpec]:
    specs: list[_ControlSpec] = []
    for control_input in config.sequence_batching.control_input:
        control = control_input.control[0]
        if control.kind == Control.CONTROL_SEQUENCE_CORRID:
            corrid_types: dict[int, np.dtype[Any]] = {
                mc.TYPE_UINT64: np.dtype(np.uint64),
                mc.TYPE_INT64: np.dtype(np.int64),
                mc.TYPE_UINT32: np.dtype(np.uint32),
                mc.TYPE_INT32: np.dtype(np.int32),
            }
            dtype = corrid_types.get(control.data_type)  # None: TYPE_STRING
            specs.append(_ControlSpec(control_input.name, control.kind, dtype))
        elif control.int32_false_true:
            values = tuple(control.int32_false_true)
            specs.append(_ControlSpec(control_input.name, control.kind, np.dtype(np.int32), values))
        elif control.fp32_false_true:
            values = tuple(control.fp32_false_true)
            specs.append(
                _ControlSpec(control_input.name, control.kind, np.dtype(np.float32), values)
            )
        else:
            values = tuple(control.bool_false_true)
            specs.append(_ControlSpec(control_input.name, control.kind, np.dtype(np.bool_), values))
    return specs


class SequenceScheduler(Scheduler):
    """The direct sequence batcher of one model version (on the event loop)."""

    def __init__(
        self,
        config: mc.ModelConfig,
        workers: list[InstanceThread],
        stats: ModelStatistics,
        on_job_done: JobDone,
        clock: Clock = MONOTONIC,
    ) -> None:
        super().__init__(config, workers, stats, on_job_done, clock)
        batching = config.sequence_batching
        self._idle_ns = (batching.max_sequence_idle_microseconds or 1_000_000) * 1000
        self._batched = config.max_batch_size > 0
        per_instance = max(config.max_batch_size, 1)
        self._slots: dict[InstanceThread, list[_Slot]] = {
            worker: [_Slot(worker, index) for index in range(per_instance)] for worker in workers
        }
        self._controls = _control_specs(config)
        corrid_type = next(
            (
                control.control[0].data_type
                for control in batching.control_input
                if control.control[0].kind == Control.CONTROL_SEQUENCE_CORRID
            ),
            None,
        )
        # None: any correlation ID type (no CORRID control tensor to fill)
        self._corrid_str: bool | None = (
            None if corrid_type is None else corrid_type == mc.TYPE_STRING
        )
        self._sequences: dict[tuple[bool, CorrelationId], _Sequence] = {}
        self._backlog: deque[_Sequence] = deque()
        self._running: dict[int, _Sequence] = {}  # id(job) -> its sequence, while executing
        self._reaper: Timer | None = None
        self._states: StateKeeper | None = None

    def keep_states(self, states: StateKeeper | None) -> None:
        """Carry implicit state from each request's output to its sequence's next input."""
        self._states = states

    def _prepare(self, job: Job, sequence: _Sequence) -> None:
        """Before a request's shapes are compared for batching: its implicit state inputs."""
        if self._states is None:
            return
        if job.request.parameters.get("sequence_start"):
            sequence.states = None
        self._states.add_inputs(job.inputs, sequence.states)

    # ---- queue side -------------------------------------------------------------------------

    def enqueue(self, job: Job) -> None:
        if self._closed:
            raise unavailable("model is being unloaded")
        parameters = job.request.parameters
        corrid = parameters.get("sequence_id", 0)
        if isinstance(corrid, bool) or not isinstance(corrid, (int, str)) or corrid in (0, ""):
            raise invalid_arg(
                f"inference request to model '{self._name}' must specify a non-zero or "
                "non-empty correlation ID"
            )
        if self._batched and job.rows != 1:
            raise invalid_arg(
                f"inference request to model '{self._name}' must specify batch-size 1 due to "
                "requirements of sequence batcher"
            )
        is_str = isinstance(corrid, str)
        if self._corrid_str is not None and is_str != self._corrid_str:
            # Triton feeds the string's bytes (or the number's) as the other type; refuse instead.
            raise invalid_arg(
                f"inference request for sequence {corrid} to model '{self._name}': correlation "
                f"ID in request is not {'a string' if self._corrid_str else 'an unsigned int'}"
            )
        start = bool(parameters.get("sequence_start"))
        end = bool(parameters.get("sequence_end"))
        key = (is_str, corrid)
        sequence = self._sequences.get(key)
        if sequence is None or (sequence.ended and not start):
            if not start:
                raise invalid_arg(
                    f"inference request for sequence {corrid} to model '{self._name}' must "
                    "specify the START flag on the first request of the sequence"
                )
        elif start and not sequence.ended:
            log.warning(
                "sequence %s for model '%s' has a conflict. The previous sequence did not end "
                "before this sequence start. Previous sequence will be terminated early.",
                corrid,
                self._name,
            )
        now = self._now_ns()
        if sequence is None:
            sequence = _Sequence(corrid)
            self._sequences[key] = sequence
            self._assign(sequence)
        sequence.ended = end
        sequence.last_ns = now
        job.priority = 1
        job.enqueued_ns = now
        job.deadline_ns = 0
        job.seq = self._next_seq
        self._next_seq += 1
        sequence.jobs.append(job)
        self._queued += 1
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "request '%s' of sequence %s for '%s' queued (%s)",
                job.request.id or "<id_unknown>",
                corrid,
                self._name,
                "backlog"
                if sequence.slot is None
                else f"slot {sequence.slot.index} of {sequence.slot.worker.spec.name}",
            )
        self._arm_reaper()
        self._dispatch()

    def _assign(self, sequence: _Sequence) -> None:
        """Bind a sequence to a free slot, or put it in the backlog."""
        for worker in self._workers:
            for slot in self._slots[worker]:
                if slot.sequence is None:
                    slot.sequence = sequence
                    sequence.slot = slot
                    return
        self._backlog.append(sequence)

    def _release(self, sequence: _Sequence) -> None:
        """The sequence ended (or idled out): forget it and give its slot to the backlog."""
        key = (isinstance(sequence.corrid, str), sequence.corrid)
        if self._sequences.get(key) is sequence:
            del self._sequences[key]
        slot = sequence.slot
        sequence.slot = None
        if slot is None:
            if sequence in self._backlog:
                self._backlog.remove(sequence)
            return
        slot.sequence = None
        if self._backlog:
            waiting = self._backlog.popleft()
            slot.sequence = waiting
            waiting.slot = slot

    # ---- batch formation --------------------------------------------------------------------

    def _dispatch(self) -> None:
        if not self._queued:
            return
        now = self._now_ns()
        for worker in list(self._idle):
            batch: list[Job] = []
            for slot in self._slots[worker]:
                sequence = slot.sequence
                if sequence is None or sequence.busy:
                    continue
                self._drop_cancelled_of(sequence, now)
                if not sequence.jobs:
                    continue
                job = sequence.jobs[0]
                self._prepare(job, sequence)
                if batch and not _same_shapes(batch[0], job):
                    continue  # a later batch takes it
                sequence.jobs.popleft()
                sequence.busy = True
                self._running[id(job)] = sequence
                batch.append(job)
            if not batch:
                continue
            for job in batch:  # after the shapes were compared: every job gets the same ones
                self._add_controls(job, self._running[id(job)])
            self._idle.remove(worker)
            self._launch(worker, batch)
            if not self._queued:
                return

    def _drop_cancelled_of(self, sequence: _Sequence, now: int) -> None:
        if not (sequence.jobs and sequence.jobs[0].future.done()):
            return
        while sequence.jobs and sequence.jobs[0].future.done():
            self._queued -= 1
            self._finish(sequence.jobs.popleft(), None, now, None)
        if not sequence.jobs:
            self._arm_reaper()  # idle now: it may time out

    def _add_controls(self, job: Job, sequence: _Sequence) -> None:
        parameters = job.request.parameters
        flags = {
            Control.CONTROL_SEQUENCE_START: bool(parameters.get("sequence_start")),
            Control.CONTROL_SEQUENCE_END: bool(parameters.get("sequence_end")),
            Control.CONTROL_SEQUENCE_READY: True,
        }
        shape = (1, 1) if self._batched else (1,)
        for control in self._controls:
            if control.kind == Control.CONTROL_SEQUENCE_CORRID:
                if control.dtype is None:
                    array = np.array([str(sequence.corrid).encode()], dtype=object)
                else:
                    array = np.array([sequence.corrid], dtype=control.dtype)
            else:
                value = control.values[1 if flags[control.kind] else 0]
                array = np.array([value], dtype=control.dtype)
            job.inputs[control.name] = array.reshape(shape)

    # ---- completion -------------------------------------------------------------------------

    def _on_batch_done(
        self, worker: InstanceThread, batch: list[Job], result: BatchResult, inline: bool = False
    ) -> None:
        now = self._now_ns()
        idle = False
        for index, job in enumerate(batch):
            sequence = self._running.pop(id(job), None)
            if sequence is None:
                continue
            if self._states is not None and result.error is None:
                sequence.states = self._states.updated(sequence.states, result.outputs[index])
            sequence.busy = False
            sequence.last_ns = now
            if not sequence.jobs:
                if job.request.parameters.get("sequence_end"):
                    self._release(sequence)
                else:
                    idle = True
        super()._on_batch_done(worker, batch, result, inline)
        if idle:
            self._arm_reaper()

    # ---- idle sequences ---------------------------------------------------------------------

    def _arm_reaper(self) -> None:
        """Time the release of the sequence idle the longest. Only idle sequences (nothing
        queued or executing) count: a timer for one that is busy or waiting would be due
        already and fire again on every loop iteration until it is idle. Armed whenever a
        sequence may have become idle: a request finished or was cancelled, or one arrived."""
        if self._reaper is not None or self._closed:
            return
        idle = [s.last_ns for s in self._sequences.values() if not s.busy and not s.jobs]
        if idle:
            self._reaper = self._clock.call_at(min(idle) + self._idle_ns, self._reap)

    def _reap(self) -> None:
        """Release the sequences idle (nothing queued or executing) for longer than
        max_sequence_idle_microseconds; a later request for one needs START again."""
        self._reaper = None
        now = self._now_ns()
        for sequence in list(self._sequences.values()):
            if sequence.busy or sequence.jobs or now - sequence.last_ns < self._idle_ns:
                continue
            log.info(
                "sequence %s for model '%s' released: idle for more than %d us",
                sequence.corrid,
                self._name,
                self._idle_ns // 1000,
            )
            self._release(sequence)
        self._arm_reaper()
        self._dispatch()

    def close(self) -> None:
        self._closed = True
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        now = self._now_ns()
        for sequence in list(self._sequences.values()):
            while sequence.jobs:
                self._queued -= 1
                self._finish(
                    sequence.jobs.popleft(),
                    None,
                    now,
                    InferenceServerError(ErrorCode.UNAVAILABLE, "model is being unloaded"),
                )
        self._sequences.clear()
        self._backlog.clear()
        super().close()
