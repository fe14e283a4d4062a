"""The one small interface every backend implements.

A backend loads one model version for one instance (its device and thread budget) and executes a
whole batch of inputs. Batching, queueing, statistics and splitting a batch back into responses are
the core's job, done once for every backend.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

if TYPE_CHECKING:
    from oceanus.core.errors import InferenceServerError


@dataclass(frozen=True)
class InstanceSpec:
    """Where and how one model instance runs."""

    name: str  # Triton's instance name, "<group name>_<n>"
    kind: str  # "CPU" or "GPU" (after any fallback)
    device_id: int
    cpu_threads: int  # the share of the machine's cores this instance may use


@dataclass(slots=True)
class RequestsResult:
    """What `BackendInstance.execute_requests` returns: one entry per request, in order (its
    outputs, or the error that request alone gets), and the time spent on each phase."""

    outputs: list[dict[str, np.ndarray] | InferenceServerError]
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0
    # Per request: the response parameters the model set (None: none), when any request has some.
    parameters: list[dict[str, Any] | None] | None = None


class BackendInstance(ABC):
    """One loaded copy of a model, executed by one thread at a time."""

    @abstractmethod
    def execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch; inputs and outputs keyed by tensor name, batch dimension included."""

    # Optional per-request path (the Python backend): a backend that defines
    # `execute_requests(jobs) -> RequestsResult` gets the batch as the requests themselves
    # (each job has `.request`, an InferRequest, `.inputs`, its validated arrays, and `.stream`
    # for decoupled models) instead of one concatenated batch; raising fails every request.
    execute_requests: Any = None

    def healthy(self) -> bool:
        """False while the instance cannot execute (a crashed worker being restarted): the
        model then reports not ready."""
        return True

    def ready_check(self) -> bool:
        """The model's own readiness check (a Python model's `is_ready()`), asked by the model
        ready endpoints only; called on the event loop, so it must not block for long."""
        return True

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the instance holds."""


class Backend(ABC):
    """A framework: checks configs against model files and loads instances."""

    name: str

    @abstractmethod
    def model_path(self, config: mc.ModelConfig, version_dir: Path) -> Path:
        """The model file (or folder) of one version; raises if it is missing."""

    def complete_config(self, config: mc.ModelConfig, model_path: Path, autocomplete: bool) -> None:  # noqa: B027
        """Fill what the config leaves out from the model file (when autocomplete is on) and check
        the config against the model file; raises InferenceServerError naming the tensor."""

    @abstractmethod
    def load(self, config: mc.ModelConfig, model_path: Path, spec: InstanceSpec) -> BackendInstance:
        """Load one instance. Runs on a loader thread, never on the event loop."""

    def gpu_available(self) -> bool:
        return False
