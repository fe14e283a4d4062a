"""A loaded model version: its config, instances, scheduler and statistics."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.core.errors import ErrorCode, InferenceServerError, unavailable
from oceanus.core.instance import BatchResult, InstanceWorker, Job
from oceanus.core.scheduler import Scheduler
from oceanus.core.statistics import ModelStatistics
from oceanus.core.types import InferRequest, InferResponse, RequestedOutput, Tensor
from oceanus.core.validation import TensorSpec, validate_request


class ModelState(enum.Enum):
    UNKNOWN = "UNKNOWN"
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


def _failure_reason(error: InferenceServerError | None) -> str:
    if error is None:
        return "CANCELED"
    if error.code == ErrorCode.UNAVAILABLE:
        return "REJECTED"
    if error.code in (ErrorCode.INTERNAL, ErrorCode.UNKNOWN):
        return "BACKEND"
    return "OTHER"


class ModelVersion:
    """One version of one model. `infer` is called on the event loop."""

    def __init__(self, name: str, version: int, config: mc.ModelConfig, path: Path) -> None:
        self.name = name
        self.version = version
        self.version_str = str(version)
        self.config = config
        self.path = path
        self.state = ModelState.LOADING
        self.reason = ""
        self.stats = ModelStatistics()
        self.load_duration_s = 0.0
        self.inputs = {t.name: TensorSpec.from_config(t) for t in config.input}
        self.outputs = {t.name: TensorSpec.from_config(t) for t in config.output}
        self._output_order = [t.name for t in config.output]
        self.scheduler: Scheduler | None = None

    @property
    def ready(self) -> bool:
        return self.state is ModelState.READY

    def start(self, workers: list[InstanceWorker]) -> None:
        """Attach loaded instances; runs on the event loop."""
        self.scheduler = Scheduler(self.config, workers, self.stats, self._complete)
        self.state = ModelState.READY

    def infer(self, request: InferRequest) -> asyncio.Future[InferResponse]:
        """Validate and queue a request; the future resolves with its response."""
        loop = asyncio.get_running_loop()
        if self.scheduler is None or self.state is not ModelState.READY:
            raise unavailable(
                f"Request for unknown model: '{self.name}' version {self.version} is not at "
                "ready state"
            )
        # As in Triton, requests refused before they are queued (invalid, queue full) are not
        # counted in the statistics.
        inputs, rows = validate_request(
            request, self.name, self.config.max_batch_size, self.inputs, self.outputs
        )
        future: asyncio.Future[InferResponse] = loop.create_future()
        self.scheduler.enqueue(Job(request=request, inputs=inputs, rows=rows, future=future))
        return future

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
        if outputs is None or result is None or error is not None:
            self.stats.record_failure(now - request.received_ns, _failure_reason(error))
            if error is not None and not future.done():
                future.set_exception(error)
            return
        if future.cancelled():
            self.stats.record_failure(now - request.received_ns, "CANCELED")
            return
        self.stats.record_success(
            request_ns=now - request.received_ns,
            queue_ns=job.started_ns - job.enqueued_ns,
            input_ns=result.input_ns,
            infer_ns=result.infer_ns,
            output_ns=result.output_ns,
            rows=job.rows,
        )
        future.set_result(self._response(request, outputs))

    def _response(self, request: InferRequest, outputs: dict[str, np.ndarray]) -> InferResponse:
        requested: dict[str, RequestedOutput] | None = None
        if request.outputs is None:
            names = self._output_order
        else:
            requested = {o.name: o for o in request.outputs}
            names = [o.name for o in request.outputs]
        tensors = []
        for name in names:
            array = outputs[name]
            spec = self.outputs[name]
            tensors.append(Tensor(name, spec.datatype.name, array.shape, array))
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


@dataclass
class ModelEntry:
    """A model folder and what became of it: its versions, or why it failed."""

    name: str
    folder: Path
    config: mc.ModelConfig | None = None
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    error: str = ""

    def highest_ready(self) -> ModelVersion | None:
        for version in sorted(self.versions, reverse=True):
            if self.versions[version].ready:
                return self.versions[version]
        return None
