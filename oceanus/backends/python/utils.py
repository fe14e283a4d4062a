"""The `triton_python_backend_utils` API that model.py files import (as `pb_utils`).

Written for Oceanus after Triton's Python backend documentation: the same names, signatures and
behaviour, so model.py files written for Triton run unchanged. Inside a stub process the
top-level module `triton_python_backend_utils` is this module. Outside a stub (in a unit test,
say) everything works except what needs the server: BLS `exec`, response senders, cancellation
queries and logging to the server log (which then goes to Python's logging).

The implementation is in the pb/ package, one module per job; this module is its public face.
"""

from __future__ import annotations

from oceanus.backends.python.pb.config import ModelConfig
from oceanus.backends.python.pb.metrics import Metric, MetricFamily
from oceanus.backends.python.pb.requests import (
    InferenceRequest,
    InferenceResponse,
    InferenceResponseSender,
    PreferredMemory,
)
from oceanus.backends.python.pb.runtime import Logger, is_model_ready, load_model, unload_model
from oceanus.backends.python.pb.types import (
    TRITON_STRING_TO_NUMPY,
    TRITONSERVER_MEMORY_CPU,
    TRITONSERVER_MEMORY_CPU_PINNED,
    TRITONSERVER_MEMORY_GPU,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    Tensor,
    TritonError,
    TritonModelException,
    deserialize_bytes_tensor,
    get_input_config_by_name,
    get_input_tensor_by_name,
    get_output_config_by_name,
    get_output_tensor_by_name,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
    using_decoupled_model_transaction_policy,
)

__all__ = [
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_CPU_PINNED",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITON_STRING_TO_NUMPY",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "Logger",
    "Metric",
    "MetricFamily",
    "ModelConfig",
    "PreferredMemory",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "is_model_ready",
    "load_model",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "unload_model",
    "using_decoupled_model_transaction_policy",
]
