"""Oceanus inside a Python process (docs/embedded.md): `Server`, its models, requests,
responses and tensors, with the call shapes of NVIDIA's `tritonserver` package.

    import oceanus
    server = oceanus.Server(model_repository="models").start(wait_until_ready=True)
    for response in server.model("simple").infer(inputs={"INPUT0": a, "INPUT1": b}):
        total = numpy.from_dlpack(response.outputs["OUTPUT0"])
"""

from oceanus.embedded.errors import (
    AlreadyExistsError,
    CancelledError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    TritonError,
    UnavailableError,
    UnknownError,
    UnsupportedError,
)
from oceanus.embedded.model import Model, ModelBatchFlag, ModelTxnPropertyFlag
from oceanus.embedded.requests import (
    AsyncResponseIterator,
    InferenceRequest,
    InferenceResponse,
    ResponseIterator,
)
from oceanus.embedded.server import ModelDictionary, Server
from oceanus.embedded.tensor import DataType, MemoryType, Tensor

__all__ = [
    "AlreadyExistsError",
    "AsyncResponseIterator",
    "CancelledError",
    "DataType",
    "InferenceRequest",
    "InferenceResponse",
    "InternalError",
    "InvalidArgumentError",
    "MemoryType",
    "Model",
    "ModelBatchFlag",
    "ModelDictionary",
    "ModelTxnPropertyFlag",
    "NotFoundError",
    "ResponseIterator",
    "Server",
    "Tensor",
    "TritonError",
    "UnavailableError",
    "UnknownError",
    "UnsupportedError",
]
