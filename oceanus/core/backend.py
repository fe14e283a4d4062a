"""The contract between the core and every backend (docs/backends.md, "The contract").

A backend declares itself with a `BackendSpec` (core/backend_registry.py) and implements
`Backend`: check a config against its model file, then load one `BackendInstance` per model
instance. An instance executes either whole batches (`BatchInstance.execute`: the core
concatenates the requests' inputs and splits the outputs) or the requests themselves
(`RequestInstance.execute_requests`: the Python backend, which answers each request on its own).
Batching, queueing, statistics, validation and responses are the core's job, done once for all.

Backends get everything through the arguments here, never through a global: the model's config
and files, where the instance runs, and a `ServerHandle` for calling back into the server (BLS
requests, model control, custom metrics).
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.core.errors import InferenceServerError, invalid_arg, unavailable
from oceanus.core.generation import GenerationInfo, LoraAdapters
from oceanus.core.observability.custom_metrics import CustomMetricRegistry
from oceanus.core.types import InferRequest, InferResponse

Arrays = dict[str, np.ndarray]


@dataclass(frozen=True)
class InstanceSpec:
    """Where and how one model instance runs."""

    name: str  # Triton's instance name, "<group name>_<n>"
    kind: str  # "CPU" or "GPU" (after any fallback)
    device_id: int
    cpu_threads: int  # the share of the machine's cores this instance may use


@dataclass(frozen=True)
class ModelFiles:
    """The files of the model version an instance serves."""

    model_dir: Path  # <repository>/<model>
    version_dir: Path  # <repository>/<model>/<version>
    model_path: Path  # the model file (or folder) that Backend.model_path resolved


class ServerHandle(Protocol):
    """What a backend may ask of the running server (the server core implements it). Every
    method is called on `loop`; backends on other threads use `loop.call_soon_threadsafe`."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    @property
    def custom_metrics(self) -> CustomMetricRegistry: ...

    def infer(self, request: InferRequest, caller: str) -> asyncio.Future[InferResponse]: ...

    def infer_stream(
        self, request: InferRequest, empty_final: bool | None = None
    ) -> AsyncIterator[InferResponse]: ...

    def is_decoupled(self, name: str, version: str = "") -> bool: ...

    def model_ready(self, name: str, version: str = "") -> bool: ...

    def model_serving(self, name: str, version: str = "") -> bool:
        """Loaded and able to execute (without the model's own readiness check)."""
        ...

    def queued_count(self, name: str, version: str) -> int:
        """Requests for this model version waiting in the server's queue, not yet handed to an
        instance (0 for an unknown version). A plain read: callable from any thread (the LLM
        engine counts them into vLLM's `vllm:num_requests_waiting`)."""
        ...

    async def load_model(
        self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None
    ) -> None: ...

    async def unload_model(self, name: str) -> None: ...


@dataclass(frozen=True)
class LoadContext:
    """Everything `Backend.load` is handed for one instance."""

    config: mc.ModelConfig
    files: ModelFiles
    spec: InstanceSpec
    # None only outside a running server (a backend's unit test, `oceanus tune`'s dry runs).
    server: ServerHandle | None = None


class ResponseStream(Protocol):
    """Where a decoupled model's responses to one request go; callable from any thread."""

    def send(
        self,
        outputs: Arrays | None,
        error: InferenceServerError | None,
        final: bool,
        parameters: dict[str, Any] | None = None,
    ) -> None: ...

    def cancelled(self) -> bool:
        """Whether the reader left before the final response (a cancelled gRPC stream, a
        closed SSE connection): a model that keeps generating after its request returned
        (the LLM engine) polls this to free the request's place."""
        ...


class RequestJob(Protocol):
    """One request as a request-style backend receives it."""

    @property
    def request(self) -> InferRequest: ...

    @property
    def inputs(self) -> Arrays:
        """The validated inputs by name (arrays of the request's shapes)."""
        ...

    @property
    def stream(self) -> ResponseStream | None:
        """Decoupled models: where this request's responses go (None otherwise)."""
        ...

    def cancelled(self) -> bool:
        """Whether the client gave up on the request (pb_utils `is_cancelled()`)."""
        ...


@dataclass(slots=True)
class RequestsResult:
    """What `RequestInstance.execute_requests` returns: one entry per request, in order (its
    outputs, or the error that request alone gets, which Triton counts as a success), and the
    time spent on each phase."""

    outputs: list[Arrays | InferenceServerError]
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0
    # Per request: the response parameters the model set (None: none), when any request has some.
    parameters: list[dict[str, Any] | None] | None = None


class BackendInstance(ABC):  # noqa: B024 - abstract through its two subclasses
    """One loaded copy of a model, executed by one thread at a time. Subclass `BatchInstance`
    or `RequestInstance`."""

    def healthy(self) -> bool:
        """False while the instance cannot execute (a crashed stub being restarted): the
        model then reports not ready."""
        return True

    def ready_check(self) -> bool:
        """The model's own readiness check (a Python model's `is_ready()`), asked by the model
        ready endpoints only; called on the event loop, so it must not block for long."""
        return True

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the instance holds."""

    def generation_info(self) -> GenerationInfo | None:
        """An engine that takes typed requests (`InferRequest.generation`: token ids, typed
        sampling parameters) says so here, with its context length and tokenizer; None: the
        model speaks tensors only."""
        return None

    def lora_adapters(self) -> LoraAdapters | None:
        """An engine that serves LoRA adapters hands them out here (None: it serves none)."""
        return None


class BatchInstance(BackendInstance):
    """An instance that executes one assembled batch at a time."""

    # Whether a batch that takes under ~100 µs may run on the event loop instead of the
    # instance's thread (core/scheduling/instance.py): true for CPU runtimes that keep no per-thread
    # state. The core never runs GPU instances there (a CUDA context is bound to its thread).
    loop_safe: ClassVar[bool] = True

    @abstractmethod
    def execute(self, inputs: Arrays) -> Arrays:
        """Run one batch; inputs and outputs keyed by tensor name, batch dimension included."""


class RequestInstance(BackendInstance):
    """An instance that gets the requests of a batch themselves and answers each one; raising
    fails every request of the batch. Never run on the event loop (it runs user code)."""

    # True: batches go to `submit_on_loop`, on the event loop, instead of the instance's thread
    # (an instance whose work runs elsewhere and which can wait for it without blocking: the
    # Python backend's stub). Set before the instance is handed to the core.
    loop_driven: bool = False

    @abstractmethod
    def execute_requests(self, jobs: Sequence[RequestJob]) -> RequestsResult: ...

    def submit_on_loop(
        self, jobs: Sequence[RequestJob], done: Callable[[RequestsResult | Exception], None]
    ) -> None:
        """For a `loop_driven` instance: called on the event loop, start executing `jobs`
        without blocking and later call `done` once, on the loop, with the result or the
        error. Batches are executed one after another, in the order they were submitted."""
        raise NotImplementedError

    def start_requests(self, jobs: Sequence[RequestJob]) -> Callable[[], RequestsResult]:
        """Begin executing `jobs` and return what waits for their result. The instance thread
        starts every execution of a group before it waits for the first, so a backend whose
        executions queue in order elsewhere (the Python backend's stub) overrides this and the
        group crosses to it in one go. By default the execution runs here."""
        result = self.execute_requests(jobs)
        return lambda: result


class Backend(ABC):
    """A framework: checks configs against model files and loads instances. One object per
    backend serves every model that uses it; `load` runs on loader threads, several at a time."""

    name: ClassVar[str]
    # The model file a version folder holds when the config names none.
    default_model_filename: ClassVar[str]

    def model_path(self, config: mc.ModelConfig, version_dir: Path) -> Path:
        """The model file (or folder) of one version; raises UNAVAILABLE if it is missing."""
        return model_file(config, version_dir, self.default_model_filename)

    def complete_config(self, config: mc.ModelConfig, model_path: Path, autocomplete: bool) -> None:  # noqa: B027
        """Fill what the config leaves out from the model file (when autocomplete is on) and check
        the config against the model file; raises InferenceServerError naming the tensor."""

    @abstractmethod
    def load(self, context: LoadContext) -> BackendInstance:
        """Load one instance. Runs on a loader thread, never on the event loop."""

    def gpu_available(self) -> bool:
        return False


def model_file(
    config: mc.ModelConfig, version_dir: Path, default: str, folder_holds: str | None = None
) -> Path:
    """`default_model_filename` (or `default`) inside the version folder, as Triton resolves
    it: a name that would leave the folder (`..`, an absolute path) is refused. `folder_holds`:
    the file a folder of that name may hold instead (ONNX models with external data)."""
    name = config.default_model_filename or default
    path = version_dir / name
    inside = Path(name).parts and not Path(name).is_absolute() and ".." not in Path(name).parts
    if not inside:  # the config's mistake (a client's, for a load override): 400, not 503
        raise invalid_arg(
            f"unable to find '{name}' for model '{config.name}': default_model_filename must "
            f"name a file inside the version folder '{version_dir.name}'"
        )
    if folder_holds is not None and path.is_dir():
        path = path / folder_holds
    if not path.exists():
        raise unavailable(
            f"unable to find '{path}' for model '{config.name}': version folder "
            f"'{version_dir.name}' has no model file (set default_model_filename if it is "
            "named differently)"
        )
    return path
