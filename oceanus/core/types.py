"""Plain data that crosses between frontends and the core: requests, tensors, responses.

Everything here is names, datatype names, shapes and numpy arrays, never wire objects, so any
frontend (and later, a frontend in another process) can build them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from oceanus.core.generation import GenerationOutput, GenerationRequest


@dataclass(slots=True)
class Tensor:
    """A named tensor: Triton datatype name, shape, and the data as a numpy array of that shape."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for, with its per-output parameters (binary_data, class_count)."""

    name: str
    parameters: dict[str, Any] = field(default_factory=dict)
    # Where the output goes when the client named a shared memory region for it
    # (oceanus.core.shared_memory.ShmTarget): the core writes it there and responses carry no data.
    shm: Any = None


@dataclass(slots=True)
class InferRequest:
    model_name: str
    model_version: str = ""
    id: str = ""
    inputs: list[Tensor] = field(default_factory=list)
    # None means "every output of the model".
    outputs: list[RequestedOutput] | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    # Monotonic receive time, taken by the frontend as the request arrives.
    received_ns: int = field(default_factory=time.monotonic_ns)
    # A sampled request's oceanus.core.observability.tracing.Trace (None: not traced, the usual
    # case).
    trace: Any = None
    # The shared memory regions its inputs and outputs use (oceanus.core.shared_memory.Region),
    # held in use while it is queued or executing; None: none.
    shm_regions: list[Any] | None = None
    # The `serial` of the model version whose config a frontend worker validated it against
    # (validate_request there, on a mirrored copy); 0: not validated yet (docs/architecture.md,
    # "The core's budget per request").
    checked: int = 0
    # The response cache's key for it, computed by the frontend worker that validated it
    # (response_cache.request_key); trusted only together with `checked`. b"": the core's.
    cache_key: bytes = b""
    # A language model's typed request (prompt token ids, sampling parameters) for an engine
    # that publishes GenerationInfo; its inputs then hold only what the config requires.
    generation: GenerationRequest | None = None


@dataclass(slots=True)
class InferResponse:
    model_name: str
    model_version: str
    id: str
    outputs: list[Tensor]
    # Per requested output parameters, echoed from the request so frontends can honour them.
    requested: dict[str, RequestedOutput] | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    # The engine's typed answer to a request that carried `generation` (no output tensors).
    generation: GenerationOutput | None = None


def is_number(text: str) -> bool:
    """Whether `text` is a non-negative integer in ASCII digits: version numbers and tensor
    indices are, while str.isdigit() also takes superscript digits (which int() refuses) and
    Arabic-Indic ones (which int() reads as numbers)."""
    return text.isascii() and text.isdigit()
