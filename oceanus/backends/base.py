"""The one small interface every backend implements.

A backend loads one model version for one instance (its device and thread budget) and executes a
whole batch of inputs. Batching, queueing, statistics and splitting a batch back into responses are
the core's job, done once for every backend.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc


@dataclass(frozen=True)
class InstanceSpec:
    """Where and how one model instance runs."""

    name: str  # Triton's instance name, "<group name>_<n>"
    kind: str  # "CPU" or "GPU" (after any fallback)
    device_id: int
    cpu_threads: int  # the share of the machine's cores this instance may use


class BackendInstance(ABC):
    """One loaded copy of a model, executed by one thread at a time."""

    @abstractmethod
    def execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch; inputs and outputs keyed by tensor name, batch dimension included."""

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
