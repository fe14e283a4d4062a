"""Triton's model warmup (`model_warmup` in config.pbtxt).

After a version's instances are created, and before the version is READY, every instance runs
every warmup sample `count` times (at least once). A sample is `batch_size` requests whose inputs
are zeros, random bytes, or the raw contents of `<model dir>/warmup/<input_data_file>` (BYTES
inputs as Triton's length-prefixed serialization; Oceanus also looks in `<version dir>/warmup/`).
Samples with `batch_size: 0` are skipped, as Triton skips them.

Everything here runs on the loader thread that created the instances, never on the event loop.
Warmup calls the backend instances directly, without the scheduler, so its executions are not
counted in the model's statistics (as in Triton). Batched backends get one batch of `batch_size`
rows; per-request backends (the Python backend) get `batch_size` requests of one row each through
`execute_requests`, as Triton hands its backends the warmup requests.

A sample that fails fails the load with Triton's text, `failed to run warmup sample '<name>':
<error>; ` (one `<error>; ` per failed response); a sample that cannot be built (no data choice,
variable-size dims, an input the model does not have, a short data file) fails it with Triton's
text for that case, prefixed with `warmup sample '<name>': `.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.core import datatypes
from oceanus.core.backend import (
    Backend,
    BackendInstance,
    BatchInstance,
    InstanceSpec,
    RequestInstance,
    ServerHandle,
)
from oceanus.core.errors import InferenceServerError, invalid_arg
from oceanus.core.repository import loader as repository
from oceanus.core.repository.model_config import sequence_control_types
from oceanus.core.tensor_bytes import bytes_elements
from oceanus.core.types import InferRequest, Tensor
from oceanus.core.validation import TensorSpec, validate_request

log = logging.getLogger("oceanus.core.warmup")

WARMUP_FOLDER = "warmup"


@dataclass
class Sample:
    """One warmup sample, ready to run: the inputs of one request (batch dimension 1 included
    when the model batches), repeated `batch_size` times."""

    name: str
    batch_size: int
    count: int
    inputs: dict[str, np.ndarray]


@dataclass(slots=True, eq=False)
class _WarmupJob:
    """What `execute_requests` reads from a queued job (instance.Job without the future)."""

    request: InferRequest
    inputs: dict[str, np.ndarray]
    rows: int
    stream: _WarmupStream | None = None

    def cancelled(self) -> bool:
        return False


class _WarmupStream:
    """Collects a decoupled model's responses to one warmup request until the final flag."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.finished = threading.Event()

    def send(
        self,
        outputs: dict[str, np.ndarray] | None,
        error: InferenceServerError | None,
        final: bool,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        if error is not None:
            self.errors.append(error.message)
        if final:
            self.finished.set()

    def cancelled(self) -> bool:
        return False


def load_version(
    config: mc.ModelConfig,
    backend: Backend,
    version: int,
    path: Path,
    gpu_count: int,
    server: ServerHandle | None = None,
) -> repository.LoadedVersion:
    """`repository.load_version`, then the warmup of every instance (blocking). A warmup
    failure is kept as the version's load error and its instances are closed."""
    started = time.monotonic()
    samples: list[Sample] = []
    if config.model_warmup:
        try:
            samples = build_samples(config, path.parent, path)
        except InferenceServerError as exc:
            return repository.LoadedVersion(version=version, path=path, error=exc)
    loaded = repository.load_version(config, backend, version, path, gpu_count, server)
    if loaded.error is not None or not samples:
        return loaded
    try:
        for spec, instance in loaded.instances:
            run_samples(config, samples, spec, instance)
    except InferenceServerError as exc:
        loaded.error = exc
    except Exception as exc:  # a backend failure must fail the load, not the loader thread
        loaded.error = invalid_arg(f"warmup of '{config.name}' failed: {type(exc).__name__}: {exc}")
    if loaded.error is not None:
        for _, instance in loaded.instances:
            instance.close()
        loaded.instances.clear()
    loaded.load_seconds = time.monotonic() - started  # the warmup is part of the load
    return loaded


# ---- building samples ---------------------------------------------------------------------------


def build_samples(config: mc.ModelConfig, model_dir: Path, version_dir: Path) -> list[Sample]:
    """The config's warmup samples with their data (raises with the reason)."""
    samples: list[Sample] = []
    rng = np.random.default_rng()
    for setting in config.model_warmup:
        if setting.batch_size == 0:
            log.info("skipping batch 0 warmup sample '%s' of '%s'", setting.name, config.name)
            continue
        try:
            inputs = _sample_inputs(config, setting, model_dir, version_dir, rng)
        except InferenceServerError as exc:
            raise invalid_arg(f"warmup sample '{setting.name}': {exc.message}") from None
        samples.append(Sample(setting.name, setting.batch_size, setting.count or 1, inputs))
    return samples


def _sample_inputs(
    config: mc.ModelConfig,
    setting: mc.ModelWarmup,
    model_dir: Path,
    version_dir: Path,
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    batched = config.max_batch_size > 0
    controls = sequence_control_types(config)
    original: list[Tensor] = []
    extra: dict[str, np.ndarray] = {}
    for name in sorted(setting.inputs):
        value = setting.inputs[name]
        dims = tuple(int(d) for d in value.dims)
        if any(d < 0 for d in dims):
            raise invalid_arg(
                "warmup setting expects all variable-size dimensions are specified for input "
                f"'{name}'"
            )
        datatype = datatypes.from_config_name(mc.DataType.Name(value.data_type))
        if datatype is None:
            raise invalid_arg(f"warmup setting expects input '{name}' to have a valid data_type")
        array = _input_data(name, value, datatype, dims, model_dir, version_dir, rng)
        shape = ((1,) if batched else ()) + dims
        if name in controls:
            extra[name] = array.reshape(shape)
        else:
            original.append(Tensor(name, datatype.name, shape, array))
    request = InferRequest(model_name=config.name, inputs=original)
    specs = {t.name: TensorSpec.from_config(t) for t in config.input}
    outputs = {t.name: TensorSpec.from_config(t) for t in config.output}
    inputs, _ = validate_request(request, config.name, config.max_batch_size, specs, outputs)
    inputs.update(extra)
    return inputs


def _input_data(
    name: str,
    value: mc.ModelWarmup.Input,
    datatype: datatypes.DataType,
    dims: tuple[int, ...],
    model_dir: Path,
    version_dir: Path,
    rng: np.random.Generator,
) -> np.ndarray:
    """The flat data of one input for one request."""
    count = 1
    for dim in dims:
        count *= dim
    choice = value.WhichOneof("input_data_type")
    if choice is None:
        raise invalid_arg(f"warmup setting expects input '{name}' to have input_data_type set")
    if choice == "input_data_file":
        return _file_data(name, value.input_data_file, datatype, count, model_dir, version_dir)
    if datatype.is_bytes:  # zero and random strings are both empty strings, as in Triton
        array = np.empty(count, dtype=object)
        array[:] = [b""] * count
        return array
    if choice == "zero_data":
        return np.zeros(count, dtype=datatype.dtype)
    if datatype.name == "BOOL":
        return rng.integers(0, 2, count).astype(np.bool_)
    raw = rng.bytes(count * datatype.itemsize)
    random: np.ndarray = np.frombuffer(raw, dtype=datatype.dtype).copy()
    return random


def _file_data(
    name: str,
    file_name: str,
    datatype: datatypes.DataType,
    count: int,
    model_dir: Path,
    version_dir: Path,
) -> np.ndarray:
    path = model_dir / WARMUP_FOLDER / file_name
    if not path.is_file() and (version_dir / WARMUP_FOLDER / file_name).is_file():
        path = version_dir / WARMUP_FOLDER / file_name
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise invalid_arg(f"failed to open text file for read {path}: {exc.strerror}") from None
    if datatype.is_bytes:
        return bytes_elements(name, data)
    expected = count * datatype.itemsize
    if len(data) < expected:
        raise invalid_arg(  # Triton's text, missing space before "only" included
            f"warmup setting expects {expected} bytes, but the data provided from {file_name}"
            f"only has {len(data)} bytes"
        )
    array: np.ndarray = np.frombuffer(data[:expected], dtype=datatype.dtype).copy()
    return array


# ---- running samples ----------------------------------------------------------------------------


def run_samples(
    config: mc.ModelConfig, samples: list[Sample], spec: InstanceSpec, instance: BackendInstance
) -> None:
    """Run every sample `count` times on one instance; raises Triton's text on a failure."""
    for sample in samples:
        for iteration in range(1, sample.count + 1):
            log.info(
                "model '%s' instance %s is running warmup sample '%s' for iteration %d",
                config.name,
                spec.name,
                sample.name,
                iteration,
            )
            errors = _run_once(config, sample, instance)
            if errors:
                log.error(
                    "model '%s' instance %s failed to run warmup sample '%s'",
                    config.name,
                    spec.name,
                    sample.name,
                )
                text = "".join(f"{error}; " for error in errors)
                raise invalid_arg(f"failed to run warmup sample '{sample.name}': {text}")


def _run_once(config: mc.ModelConfig, sample: Sample, instance: BackendInstance) -> list[str]:
    """The error texts of one run of the sample (empty: it succeeded)."""
    if isinstance(instance, RequestInstance):
        return _run_requests(config, sample, instance)
    assert isinstance(instance, BatchInstance)
    batches: list[dict[str, np.ndarray]]
    if config.max_batch_size > 0:
        rows = sample.batch_size
        batches = [
            {
                name: array if rows == 1 else np.concatenate([array] * rows)
                for name, array in sample.inputs.items()
            }
        ]
    else:  # no batch dimension: one execution per request
        batches = [sample.inputs] * sample.batch_size
    errors: list[str] = []
    for inputs in batches:
        try:
            instance.execute(inputs)
        except InferenceServerError as exc:
            errors.append(exc.message)
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
    return errors


def _run_requests(config: mc.ModelConfig, sample: Sample, instance: RequestInstance) -> list[str]:
    """Per-request backends: `batch_size` requests of one row, each with its own response."""
    decoupled = bool(config.model_transaction_policy.decoupled)
    jobs = [
        _WarmupJob(
            request=InferRequest(model_name=config.name, model_version=""),
            inputs=dict(sample.inputs),
            rows=1,
            stream=_WarmupStream() if decoupled else None,
        )
        for _ in range(sample.batch_size)
    ]
    try:
        result = instance.execute_requests(jobs)
    except InferenceServerError as exc:
        return [exc.message] * len(jobs)
    except Exception as exc:
        return [f"{type(exc).__name__}: {exc}"] * len(jobs)
    errors: list[str] = [
        answer.message for answer in result.outputs if isinstance(answer, InferenceServerError)
    ]
    for job in jobs:
        if isinstance(job.stream, _WarmupStream):
            job.stream.finished.wait()  # Triton, too, waits for every final response
            errors.extend(job.stream.errors)
    return errors
