"""A loaded model version: its config, instances, scheduler and statistics."""

from __future__ import annotations

import asyncio
import enum
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.core import classification, datatypes, heap
from oceanus.core.clock import MONOTONIC, Clock
from oceanus.core.errors import ErrorCode, InferenceServerError, unavailable
from oceanus.core.generation import GenerationInfo, LoraAdapters
from oceanus.core.observability.statistics import ModelStatistics
from oceanus.core.observability.tracing import ModelActivity
from oceanus.core.response_stream import ResponseStream
from oceanus.core.scheduling.dynamic_batch import Scheduler
from oceanus.core.scheduling.factory import make_scheduler
from oceanus.core.scheduling.implicit_state import StateKeeper
from oceanus.core.scheduling.instance import BatchResult, InstanceThread, Job
from oceanus.core.scheduling.rate_limiter import ModelGate
from oceanus.core.scheduling.sequence import SequenceScheduler
from oceanus.core.shared_memory import write_output
from oceanus.core.tensor_bytes import array_to_bytes
from oceanus.core.types import InferRequest, InferResponse, RequestedOutput, Tensor
from oceanus.core.validation import TensorSpec, checked_inputs, validate_request


class ModelState(enum.Enum):
    UNKNOWN = "UNKNOWN"
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


def failure_reason(error: InferenceServerError | None) -> str:
    if error is None:
        return "CANCELED"
    if error.code == ErrorCode.UNAVAILABLE:
        return "REJECTED"
    if error.code in (ErrorCode.INTERNAL, ErrorCode.UNKNOWN):
        return "BACKEND"
    return "OTHER"


# Tells loaded versions apart for life: a request a frontend worker validated against a mirrored
# config names the version's serial, and only that very version (same name, inputs, outputs,
# max_batch_size) skips the checks; any other, a reload's included, checks it again.
_serials = itertools.count(1)


class ModelVersion:
    """One version of one model. `infer` is called on the event loop."""

    # Counts versions started and stopped (in every server of the process): a copy of what is
    # loaded (frontends/workers/mirror.py) looks again only when it moved.
    changes = 0

    def __init__(
        self,
        name: str,
        version: int,
        config: mc.ModelConfig,
        path: Path,
        clock: Clock = MONOTONIC,
    ) -> None:
        self.name = name
        self.clock = clock  # what its scheduler and statistics read the time from
        self.version = version
        self.version_str = str(version)
        self.serial = next(_serials)
        self.config = config
        self.path = path
        self.state = ModelState.LOADING
        self.reason = ""
        self.stats = ModelStatistics()
        self.load_duration_s = 0.0
        self.inputs = {t.name: TensorSpec.from_config(t) for t in config.input}
        self.outputs = {t.name: TensorSpec.from_config(t) for t in config.output}
        self._max_batch_size = config.max_batch_size  # read per request: a protobuf look-up less
        self._output_order = [t.name for t in config.output]
        self.scheduler: Scheduler | None = None
        # Decoupled models answer through infer_stream() only (0..N responses per request).
        self.decoupled = bool(config.model_transaction_policy.decoupled)
        self._workers: list[InstanceThread] = []
        self._labels: dict[str, list[str]] | None = None

    def labels(self) -> dict[str, list[str]]:
        """Each output's classification labels (its label_filename's lines), read once."""
        if self._labels is None:
            outputs = ((o.name, o.label_filename) for o in self.config.output)
            self._labels = classification.read_labels(self.path.parent, outputs)
        return self._labels

    @property
    def ready(self) -> bool:
        return self.state is ModelState.READY

    @property
    def pending_count(self) -> int:
        """Requests queued or executing (a retiring version waits for none to be left)."""
        return self.scheduler.pending_count if self.scheduler is not None else 0

    def start(
        self,
        workers: list[InstanceThread],
        gate: ModelGate[InstanceThread] | None = None,
        states: StateKeeper | None = None,
    ) -> None:
        """Attach loaded instances (behind the rate limiter's `gate`, when it is on; keeping
        sequences' implicit `states`); runs on the event loop."""
        self.scheduler = make_scheduler(
            self.config, workers, self.stats, self._complete, self.clock
        )
        self.scheduler.attach_gate(gate)
        if isinstance(self.scheduler, SequenceScheduler):
            self.scheduler.keep_states(states)
        self._loop = asyncio.get_running_loop()
        self._workers = workers
        self.state = ModelState.READY
        ModelVersion.changes += 1
        heap.after_load()

    def healthy(self) -> bool:
        """Ready, and every instance able to execute (a Python model's crashed stub being
        restarted is not)."""
        return self.ready and all(w.instance.healthy() for w in self._workers)

    def ready_check(self) -> bool:
        """What the model ready endpoints report: healthy, and every instance's own readiness
        check (a Python model's `is_ready()`) passes."""
        return self.healthy() and all(w.instance.ready_check() for w in self._workers)

    def generation_info(self) -> GenerationInfo | None:
        """What an engine instance published for typed requests (None: tensors only)."""
        return self._workers[0].instance.generation_info() if self._workers else None

    def lora_adapters(self) -> list[LoraAdapters]:
        """Each instance's LoRA adapters (empty: the model serves none); every instance has its
        own engine, so an adapter is loaded into each."""
        found = [w.instance.lora_adapters() for w in self._workers]
        return [adapters for adapters in found if adapters is not None]

    def infer(self, request: InferRequest) -> asyncio.Future[InferResponse]:
        """Validate and queue a request; the future resolves with its response."""
        return self._enqueue(request, None)

    def _enqueue(
        self, request: InferRequest, stream: ResponseStream | None
    ) -> asyncio.Future[InferResponse]:
        """Validate and queue a request (its responses go to `stream` when one is given)."""
        if self.scheduler is None or self.state is not ModelState.READY:
            raise unavailable(
                f"Request for unknown model: '{self.name}' version {self.version} is not at "
                "ready state"
            )
        # As in Triton, requests refused before they are queued (invalid, queue full) are not
        # counted in the statistics.
        if request.checked == self.serial:  # a frontend worker ran validate_request already
            inputs, rows = checked_inputs(request, self._max_batch_size)
        else:
            inputs, rows = validate_request(
                request, self.name, self._max_batch_size, self.inputs, self.outputs
            )
        future: asyncio.Future[InferResponse] = self._loop.create_future()
        self.scheduler.enqueue(
            Job(request=request, inputs=inputs, rows=rows, future=future, stream=stream)
        )
        return future

    def infer_stream(
        self,
        request: InferRequest,
        empty_final: bool | None = None,
        mark_final: bool | None = None,
    ) -> AsyncIterator[InferResponse]:
        """Validate and queue a request to a decoupled model; iterate its responses.

        Errors before queueing raise here; an error response ends the iteration by raising.
        The iterator stops after the response that carries the model's final flag; a final flag
        sent alone yields an empty response only when the request's parameters ask for it
        (`triton_enable_empty_final_response`), and then every response carries the
        `triton_final_response` parameter. Leaving the iteration early cancels the request."""
        loop = asyncio.get_running_loop()
        stream = ResponseStream(self, request, loop, empty_final, mark_final)
        return stream.responses(self._enqueue(request, stream))

    def _complete(
        self,
        job: Job,
        outputs: dict[str, np.ndarray] | None,
        result: BatchResult | None,
        now: int,
        error: InferenceServerError | None,
    ) -> None:
        """Resolve one request's future and record its statistics (on the loop)."""
        request = job.request
        future = job.future
        if request.trace is not None:
            self._trace(job, outputs, result, now, error)
        if job.stream is not None:
            self._complete_stream(job, result, now, error)
            return
        if outputs is None or result is None or error is not None:
            self.stats.record_failure(now - request.received_ns, failure_reason(error))
            if error is not None and not future.done():
                future.set_exception(error)
            return
        if future.cancelled():
            self.stats.record_failure(now - request.received_ns, "CANCELED")
            return
        self._record_success(job, result, now)
        if job.response_error is not None:
            # The model answered this request with an error: the client gets it, the statistics
            # count a success (as Triton counts it).
            future.set_exception(job.response_error)
            return
        try:
            response = self._response(request, outputs)
        except InferenceServerError as exc:  # an output does not fit its shared memory region
            future.set_exception(exc)
            return
        if job.response_parameters:
            response.parameters.update(job.response_parameters)
        future.set_result(response)

    def _record_success(self, job: Job, result: BatchResult, now: int) -> None:
        self.stats.record_success(
            request_ns=now - job.request.received_ns,
            queue_ns=job.started_ns - job.enqueued_ns,
            input_ns=result.input_ns,
            infer_ns=result.infer_ns,
            output_ns=result.output_ns,
            rows=job.rows,
            # A decoupled request's first response is observed when it is sent (ResponseStream).
            first_response=job.stream is None,
        )

    def _complete_stream(
        self, job: Job, result: BatchResult | None, now: int, error: InferenceServerError | None
    ) -> None:
        """A decoupled request's execution ended; its responses travel on its stream."""
        request = job.request
        stream = job.stream
        assert isinstance(stream, ResponseStream)
        if result is None or error is not None:
            self.stats.record_failure(now - request.received_ns, failure_reason(error))
            stream.put(None, error or unavailable("request cancelled"), True)
        else:
            self._record_success(job, result, now)
            if job.response_error is not None:
                stream.put(None, job.response_error, True)
        if not job.future.done():
            job.future.set_result(None)

    def _trace(
        self,
        job: Job,
        outputs: dict[str, np.ndarray] | None,
        result: BatchResult | None,
        now: int,
        error: InferenceServerError | None,
    ) -> None:
        """Note this model's part of a traced request, from the times the statistics use."""
        request = job.request
        stamps = [("REQUEST_START", request.received_ns)]
        if job.enqueued_ns:
            stamps.append(("QUEUE_START", job.enqueued_ns))
        if result is not None and error is None and result.started_ns:
            input_end = result.started_ns + result.input_ns
            output_start = input_end + result.infer_ns
            stamps += [
                ("COMPUTE_START", result.started_ns),
                ("COMPUTE_INPUT_END", input_end),
                ("COMPUTE_OUTPUT_START", output_start),
                ("COMPUTE_END", output_start + result.output_ns),
            ]
        stamps += [("REQUEST_END", now), ("INFER_RESPONSE_COMPLETE", now)]
        tensors: list[tuple[str, str, np.ndarray, str]] = []
        if request.trace.wants_tensors:
            for name, array in job.inputs.items():
                spec = self.inputs.get(name)  # None: a sequence batcher's control tensor
                control_type = datatypes.from_numpy(array.dtype)
                datatype = (
                    spec.datatype.name
                    if spec is not None
                    else (control_type.name if control_type is not None else "BYTES")
                )
                tensors.append(("TENSOR_QUEUE_INPUT", name, array, datatype))
            for name, array in (outputs or {}).items():
                spec = self.outputs.get(name)
                datatype = spec.datatype.name if spec is not None else ""
                tensors.append(("TENSOR_BACKEND_OUTPUT", name, array, datatype))
        request.trace.record_model(
            ModelActivity(self.name, self.version, request.id, stamps, tensors)
        )

    def _response(self, request: InferRequest, outputs: dict[str, np.ndarray]) -> InferResponse:
        requested: dict[str, RequestedOutput] | None = None
        if request.outputs is None:
            names = self._output_order
        else:
            requested = {o.name: o for o in request.outputs}
            names = [o.name for o in request.outputs]
        tensors = []
        for name in names:
            array = outputs.get(name)
            if array is None:  # a Python model may leave outputs out, as in Triton
                continue
            datatype = self.outputs[name].datatype
            if array.dtype != datatype.dtype:  # a Python model's own datatype is what it sent
                datatype = datatypes.from_numpy(array.dtype) or datatype
            if requested is not None:
                target = requested[name].shm
                if target is not None:  # the client reads it from its shared memory region
                    write_output(target, name, array_to_bytes(array, datatype.name))
            tensors.append(Tensor(name, datatype.name, array.shape, array))
        return InferResponse(
            model_name=self.name,
            model_version=self.version_str,
            id=request.id,
            outputs=tensors,
            requested=requested,
        )

    def metadata(self, versions: list[str]) -> dict[str, Any]:
        """Model metadata in the KServe v2 layout (shared by every frontend)."""
        batched = self.config.max_batch_size > 0

        def tensor(spec: TensorSpec) -> dict[str, Any]:
            shape = ([-1] if batched else []) + list(spec.dims)
            return {"name": spec.name, "datatype": spec.datatype.name, "shape": shape}

        return {
            "name": self.name,
            "versions": versions,
            "platform": self.config.platform or self.config.backend,
            "inputs": [tensor(s) for s in self.inputs.values()],
            "outputs": [tensor(s) for s in self.outputs.values()],
        }

    def stop(self) -> None:
        self.state = ModelState.UNLOADING
        if self.scheduler is not None:
            self.scheduler.close()
            self.scheduler.stop_workers()
        self.state = ModelState.UNAVAILABLE
        ModelVersion.changes += 1
        heap.after_unload(getattr(self, "_loop", None))  # None: never started (an ensemble)


@dataclass
class ModelEntry:
    """A model folder and what became of it: its versions, or why it failed."""

    name: str
    folder: Path
    config: mc.ModelConfig | None = None
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    error: str = ""

    def highest_ready(self) -> ModelVersion | None:
        versions = self.versions
        if len(versions) == 1:  # the usual model: no sort per request
            (only,) = versions.values()
            return only if only.state is ModelState.READY else None
        for version in sorted(versions, reverse=True):
            if self.versions[version].ready:
                return self.versions[version]
        return None
