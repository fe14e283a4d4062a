"""Helpers for the gRPC tests (conftest.py puts this folder on sys.path)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException


def grpc_error(call: Callable[[], Any]) -> tuple[str, str]:
    """(status name, message) of the InferenceServerException `call` raises."""
    with pytest.raises(InferenceServerException) as info:
        call()
    status = str(info.value.status() or "")
    return status.replace("StatusCode.", ""), str(info.value.message())


def unary(channel: grpc.Channel, method: str, request: Any, response_type: Any) -> Any:
    """Call `inference.GRPCInferenceService/<method>` on a raw channel."""
    call = channel.unary_unary(
        f"/inference.GRPCInferenceService/{method}",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=response_type.FromString,
    )
    return call(request, timeout=30)


def raw_infer(channel: grpc.Channel, data: bytes, **options: Any) -> Any:
    method = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
    try:
        return method(data, timeout=30, **options)
    except grpc.RpcError as error:
        return error


def simple_request() -> bytes:
    request = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        request.raw_input_contents.append(np.full(16, 2, np.int32).tobytes())
    return request.SerializeToString()


def many_inputs_request() -> bytes:
    """1 MiB naming ~60,000 empty inputs: each a Python step of the decoder (0.4 s of the loop
    before they were decoded on a thread)."""
    request = pb.ModelInferRequest(model_name="simple")
    for _ in range(60_000):
        request.inputs.add(name="I", datatype="INT32", shape=[0])
        request.raw_input_contents.append(b"")
    return request.SerializeToString()
