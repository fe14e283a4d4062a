"""Ensemble models (`platform: "ensemble"`): a pipeline of other models, run by the core.

An ensemble has no backend and no instances. Its config's `ensemble_scheduling` steps name
composing models and map their inputs and outputs to ensemble tensors; a request runs every step
as soon as the tensors it reads exist (independent steps at the same time), each step being an
ordinary core request to its model (so that model's dynamic batching and statistics apply), and
the response carries the requested ensemble outputs. Validation follows Triton's
(core model_config_utils.cc and ensemble_utils.cc), with its texts. See docs/ensembles.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.core.clock import MONOTONIC, Clock
from oceanus.core.ensemble.stream import check_decoupled_steps, stream_ensemble
from oceanus.core.errors import InferenceServerError, internal, invalid_arg, unavailable
from oceanus.core.model import ModelState, ModelVersion, failure_reason
from oceanus.core.observability.tracing import ModelActivity
from oceanus.core.types import InferRequest, InferResponse, RequestedOutput, Tensor
from oceanus.core.validation import validate_request

ENSEMBLE_PLATFORM = "ensemble"
# What a step's model refuses a decoupled model with, as ServerCore.infer's `caller`.
STEP_CALLER = "ensemble step"


def is_ensemble(config: mc.ModelConfig) -> bool:
    return bool(config.platform == ENSEMBLE_PLATFORM)


class Composer(Protocol):
    """What an ensemble needs from the server core (ServerCore is one)."""

    def resolve(self, name: str, version: str = "") -> ModelVersion: ...

    def infer(self, request: InferRequest, caller: str) -> asyncio.Future[InferResponse]: ...

    def infer_stream(
        self,
        request: InferRequest,
        empty_final: bool | None = None,
        mark_final: bool | None = None,
    ) -> AsyncIterator[InferResponse]: ...

    def is_decoupled(self, name: str, version: str = "") -> bool: ...


# ---- validation of the config alone ---------------------------------------------------------


def validate_config(config: mc.ModelConfig) -> None:
    """Triton's checks of an ensemble config before any composing model is looked at."""
    name = config.name
    if config.HasField("ensemble_scheduling") and not is_ensemble(config):
        raise invalid_arg(
            f"ensemble scheduling cannot be set for model '{name}' whose platform is not "
            f"{ENSEMBLE_PLATFORM}"
        )
    if not config.HasField("ensemble_scheduling"):
        raise invalid_arg(
            f"ensemble scheduling must be set for ensemble '{name}' whose platform is "
            f"{ENSEMBLE_PLATFORM}"
        )
    if config.instance_group:
        raise invalid_arg(f"instance group should not be specified for ensemble '{name}'")
    if config.HasField("optimization"):
        raise invalid_arg(f"optimization should not be specified for ensemble '{name}'")
    if config.model_warmup:
        raise invalid_arg(f"model_warmup can not be specified for ensemble '{name}'")
    steps = config.ensemble_scheduling.step
    if not steps:
        raise invalid_arg(f"must specify 'step' for ensemble '{name}'")
    # Each ensemble tensor: the tensors it is computed from, and the tensors computed from it.
    produced: set[str] = set()
    sources: dict[str, set[str]] = {}
    readers: dict[str, set[str]] = {}
    for index, step in enumerate(steps):
        for field in ("model_name", "input_map", "output_map"):
            if not getattr(step, field):
                raise invalid_arg(f"must specify '{field}' in step {index} of ensemble '{name}'")
        for tensor in step.output_map.values():
            if tensor in produced:
                raise invalid_arg(
                    f"ensemble tensor '{tensor}' can appear in an output map only once for "
                    f"ensemble '{name}' step {index}"
                )
            produced.add(tensor)
            sources.setdefault(tensor, set()).update(step.input_map.values())
            readers.setdefault(tensor, set())
        for tensor in step.input_map.values():
            readers.setdefault(tensor, set()).update(step.output_map.values())
            sources.setdefault(tensor, set())
    # Data flow: from the ensemble inputs, a tensor is ready once every tensor it needs is.
    ready: set[str] = set()
    queue: list[str] = []
    for tensor in config.input:
        if tensor.name not in readers:
            raise invalid_arg(
                f"ensemble input '{tensor.name}' for ensemble '{name}' is not used: no step's "
                "input_map reads it"
            )
        ready.add(tensor.name)
        queue.append(tensor.name)
    while queue:
        current = queue.pop()
        for following in sorted(readers[current]):
            if following not in ready and sources[following] <= ready:
                ready.add(following)
                queue.append(following)
    outputs: set[str] = set()
    for tensor in config.output:
        if tensor.name not in readers:
            raise invalid_arg(
                f"ensemble output '{tensor.name}' for ensemble '{name}' is not used: no step's "
                "output_map writes it"
            )
        if tensor.name not in ready:
            message = f"output '{tensor.name}' for ensemble '{name}' is not written"
            source = _unconnected_source(tensor.name, sources, ready)
            if source != tensor.name:
                message += f": at least one of its depending tensors, '{source}', is not connected"
            raise invalid_arg(message)
        outputs.add(tensor.name)
    for tensor_name, consumers in readers.items():
        if tensor_name not in outputs and (tensor_name not in ready or not consumers):
            raise invalid_arg(f"ensemble tensor '{tensor_name}' is unused in ensemble '{name}'")


def _unconnected_source(tensor: str, sources: dict[str, set[str]], ready: set[str]) -> str:
    """Follow not-ready tensors back to where the data flow breaks (cycles end the walk)."""
    seen = {tensor}
    current = tensor
    while True:
        missing = [s for s in sorted(sources.get(current, ())) if s not in ready and s not in seen]
        if not missing:
            return current
        current = missing[0]
        seen.add(current)


def composing_models(config: mc.ModelConfig) -> list[tuple[str, int]]:
    """(model name, version or -1) of each step, each pair once, in step order. A version left
    out (0, which no version folder can be) means the latest, like -1."""
    pairs: list[tuple[str, int]] = []
    for step in config.ensemble_scheduling.step:
        pair = (step.model_name, max(int(step.model_version), -1) or -1)
        if pair not in pairs:
            pairs.append(pair)
    return pairs


def find_cycle(
    name: str, config: mc.ModelConfig, configs: dict[str, mc.ModelConfig | None]
) -> list[str] | None:
    """A chain of ensembles that leads back to one of them, or None. `configs` holds the
    configs of the other models (None: not readable); only ensembles have dependencies."""

    def walk(current: str, model: mc.ModelConfig, path: list[str]) -> list[str] | None:
        for dependency, _ in composing_models(model):
            if dependency in path:
                return [*path[path.index(dependency) :], dependency]
            nested = configs.get(dependency)
            if nested is not None and is_ensemble(nested):
                found = walk(dependency, nested, [*path, dependency])
                if found is not None:
                    return found
        return None

    return walk(name, config, [name])


# ---- validation against the composing models ------------------------------------------------


@dataclass
class _TensorInfo:
    model: str
    data_type: int
    dims: list[int]
    full_dims: list[int]


def _info(model: str, batching: bool, data_type: int, dims: Iterable[int]) -> _TensorInfo:
    dims = list(dims)
    return _TensorInfo(model, data_type, dims, ([-1] if batching else []) + dims)


def _dims_match(a: list[int], b: list[int]) -> bool:
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b, strict=True))


def _dims_text(dims: list[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _check_consistent(first: _TensorInfo, second: _TensorInfo, prefix: str) -> None:
    if first.data_type != second.data_type:
        raise invalid_arg(
            f"{prefix}inconsistent data type: {mc.DataType.Name(first.data_type)} is inferred "
            f"from model {first.model} while {mc.DataType.Name(second.data_type)} is inferred "
            f"from model {second.model}"
        )
    if not _dims_match(first.dims, second.dims) and not _dims_match(
        first.full_dims, second.full_dims
    ):
        raise invalid_arg(
            f"{prefix}inconsistent shape: {_dims_text(first.full_dims)} is inferred from model "
            f"{first.model} while {_dims_text(second.full_dims)} is inferred from model "
            f"{second.model}"
        )


def validate_steps(config: mc.ModelConfig, models: dict[str, mc.ModelConfig]) -> None:
    """Triton's checks of each step against its (loaded) model's config: names, datatypes,
    shapes, batch sizes. `models`: composing model name -> its config."""
    name = config.name
    batching = config.max_batch_size > 0
    tensors: dict[str, _TensorInfo] = {}
    for tensor in list(config.input) + list(config.output):
        dims = tensor.reshape.shape if tensor.HasField("reshape") else tensor.dims
        tensors[tensor.name] = _info(name, batching, tensor.data_type, dims)
    check_decoupled_steps(config, models)
    for step in config.ensemble_scheduling.step:
        model = models[step.model_name]
        step_name = step.model_name
        if 0 < model.max_batch_size < config.max_batch_size:
            raise invalid_arg(
                f"ensemble {name} allows maximum batch size {config.max_batch_size}, but it "
                f"contains model {step_name} which only allows maximum batch size to be "
                f"{model.max_batch_size}"
            )
        step_batching = model.max_batch_size > 0
        inputs = {t.name: t for t in model.input}
        for model_input, tensor in step.input_map.items():
            if model_input not in inputs:
                raise invalid_arg(
                    f"in ensemble {name}, ensemble tensor {tensor} is mapping to non-existing "
                    f"input {model_input} in model {step_name}"
                )
        for model_input in model.input:
            tensor = step.input_map.get(model_input.name)
            if tensor is None:
                if getattr(model_input, "optional", False):
                    continue
                raise invalid_arg(
                    f"in ensemble {name}, input {model_input.name} in model {step_name} is not "
                    "mapped to any ensemble tensors"
                )
            info = _info(step_name, step_batching, model_input.data_type, model_input.dims)
            _record(tensors, tensor, info, f"in ensemble {name}, ensemble tensor {tensor}: ")
        outputs = {t.name: t for t in model.output}
        for model_output, tensor in step.output_map.items():
            if model_output not in outputs:
                raise invalid_arg(
                    f"in ensemble {name}, ensemble tensor {tensor} is mapped from non-existing "
                    f"output {model_output} in model {step_name}"
                )
            output = outputs[model_output]
            info = _info(step_name, step_batching, output.data_type, output.dims)
            _record(tensors, tensor, info, f"in ensemble {name}, ensemble tensor {tensor}: ")


def _record(tensors: dict[str, _TensorInfo], tensor: str, info: _TensorInfo, prefix: str) -> None:
    known = tensors.get(tensor)
    if known is None:
        tensors[tensor] = info
    else:
        _check_consistent(known, info, prefix)


# ---- serving --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Step:
    index: int
    model_name: str
    model_version: str  # "" = the highest ready version
    input_map: dict[str, str]  # model input -> ensemble tensor
    output_map: dict[str, str]  # model output -> ensemble tensor


class EnsembleVersion(ModelVersion):
    """One version of an ensemble: no scheduler, no instances; `infer` runs the steps."""

    def __init__(
        self,
        name: str,
        version: int,
        config: mc.ModelConfig,
        path: Path,
        composer: Composer,
        keys: dict[str, str] | None = None,
        clock: Clock = MONOTONIC,
    ) -> None:
        """`keys`: the key of each composing model in the core (--model-namespacing)."""
        super().__init__(name, version, config, path, clock)
        self._composer = composer
        keys = keys or {}
        self._steps = [
            _Step(
                index,
                keys.get(step.model_name, step.model_name),
                str(step.model_version) if step.model_version > 0 else "",
                dict(step.input_map),
                dict(step.output_map),
            )
            for index, step in enumerate(config.ensemble_scheduling.step)
        ]
        self._inflight = 0

    @property
    def pending_count(self) -> int:
        return self._inflight

    def _composing(self) -> list[ModelVersion] | None:
        try:
            return [self._composer.resolve(s.model_name, s.model_version) for s in self._steps]
        except InferenceServerError:
            return None

    def healthy(self) -> bool:
        """Ready while every composing model is (an unloaded one makes the ensemble not ready)."""
        models = self._composing() if self.ready else None
        return models is not None and all(m.healthy() for m in models)

    def ready_check(self) -> bool:
        models = self._composing() if self.ready else None
        return models is not None and all(m.ready_check() for m in models)

    def infer(self, request: InferRequest) -> asyncio.Future[InferResponse]:
        given, rows = self._validate(request)
        return asyncio.get_running_loop().create_task(self._run(request, given, rows))

    def _validate(self, request: InferRequest) -> tuple[dict[str, tuple[str, np.ndarray]], int]:
        if self.state is not ModelState.READY:
            raise unavailable(
                f"Request for unknown model: '{self.name}' version {self.version} is not at "
                "ready state"
            )
        inputs, rows = validate_request(
            request, self.name, self.config.max_batch_size, self.inputs, self.outputs
        )
        return {t.name: (t.datatype, inputs[t.name]) for t in request.inputs}, rows

    def infer_stream(
        self,
        request: InferRequest,
        empty_final: bool | None = None,
        mark_final: bool | None = None,
    ) -> AsyncIterator[InferResponse]:
        """A decoupled ensemble (one of its steps is decoupled): the steps before the decoupled
        one run once, then each of its responses is an ensemble response
        (core/ensemble/stream.py)."""
        given, rows = self._validate(request)
        asked = bool(request.parameters.get("triton_enable_empty_final_response"))
        return stream_ensemble(
            self,
            request,
            given,
            rows,
            asked if empty_final is None else empty_final,
            asked if mark_final is None else mark_final,
        )

    def streamed_step(self) -> _Step | None:
        """The decoupled step whose responses the ensemble streams (checked at load)."""
        decoupled = [
            step
            for step in self._steps
            if self._composer.is_decoupled(step.model_name, step.model_version)
        ]
        return decoupled[0] if decoupled else None

    def step_request(
        self, request: InferRequest, step: _Step, tensors: dict[str, tuple[str, np.ndarray]]
    ) -> InferRequest:
        """The request a step's model gets: its inputs from the ensemble tensors."""
        inputs = []
        for model_input, tensor in step.input_map.items():
            if tensor in tensors:
                datatype, array = tensors[tensor]
                inputs.append(Tensor(model_input, datatype, array.shape, array))
        return InferRequest(
            model_name=step.model_name,
            model_version=step.model_version,
            id=request.id,
            inputs=inputs,
            outputs=[RequestedOutput(name) for name in step.output_map],
            parameters=dict(request.parameters),
            trace=request.trace,
        )

    async def _run(
        self, request: InferRequest, given: dict[str, tuple[str, np.ndarray]], rows: int
    ) -> InferResponse:
        self._inflight += 1
        try:
            try:
                tensors = await self.run_steps(request, given)
            except asyncio.CancelledError:
                self._finish(request, "CANCELED")
                raise
            except InferenceServerError as exc:
                self._finish(request, failure_reason(exc))
                raise
            self._finish(request, None, rows)
            outputs = {name: array for name, (_, array) in tensors.items() if name in self.outputs}
            return self._response(request, outputs)
        finally:
            self._inflight -= 1

    def _finish(self, request: InferRequest, failure: str | None, rows: int = 0) -> None:
        """Statistics (the ensemble's own: request counts and durations, zero compute, as
        Triton reports them) and the ensemble's part of a trace."""
        now = self.clock.now_ns()
        duration = now - request.received_ns
        if failure is None:
            self.stats.record_success(duration, 0, 0, 0, 0, rows)
        else:
            self.stats.record_failure(duration, failure)
        if request.trace is not None:
            stamps = [("REQUEST_START", request.received_ns), ("REQUEST_END", now)]
            request.trace.record_model(
                ModelActivity(self.name, self.version, request.id, stamps, [])
            )

    async def run_steps(
        self,
        request: InferRequest,
        given: dict[str, tuple[str, np.ndarray]],
        skip: _Step | None = None,
    ) -> dict[str, tuple[str, np.ndarray]]:
        """Run every step (but `skip`) once its inputs exist; the ensemble tensors (datatype,
        array)."""
        tensors = dict(given)
        # Tensors that will never exist: optional ensemble inputs left out, outputs a step's
        # model did not send (a Python model may leave outputs out).
        absent = {name for name in self.inputs if name not in given}
        waiting = [step for step in self._steps if step is not skip]
        running: dict[asyncio.Future[InferResponse], _Step] = {}
        try:
            while waiting or running:
                for step in list(waiting):
                    if all(t in tensors or t in absent for t in step.input_map.values()):
                        waiting.remove(step)
                        running[self._launch(request, step, tensors)] = step
                if not running:
                    names = ", ".join(f"'{s.model_name}'" for s in waiting)
                    raise internal(
                        f"in ensemble '{self.name}', step(s) of model {names} cannot run: their "
                        "inputs were never produced"
                    )
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for future in done:
                    step = running.pop(future)
                    if future.cancelled():  # the model dropped it (unloaded while queued)
                        raise unavailable(
                            f"in ensemble '{self.name}', the request to model "
                            f"'{step.model_name}' was cancelled"
                        )
                    response = future.result()  # a step's error is the request's error
                    produced = {t.name: t for t in response.outputs}
                    for model_output, tensor in step.output_map.items():
                        found = produced.get(model_output)
                        if found is None:
                            absent.add(tensor)
                        else:
                            tensors[tensor] = (found.datatype, found.data)
        finally:
            for future in running:
                future.cancel()  # a failed or cancelled request leaves the other steps' queues
        return tensors

    def _launch(
        self, request: InferRequest, step: _Step, tensors: dict[str, tuple[str, np.ndarray]]
    ) -> asyncio.Future[InferResponse]:
        """Send one step's request to its model (an error raised at once becomes its result)."""
        step_request = self.step_request(request, step, tensors)
        try:
            return self._composer.infer(step_request, STEP_CALLER)
        except InferenceServerError as exc:
            future: asyncio.Future[InferResponse] = asyncio.get_running_loop().create_future()
            future.set_exception(exc)
            return future

    def start_ensemble(self) -> None:
        self.state = ModelState.READY
