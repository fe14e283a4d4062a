"""Helpers for the gRPC tests (conftest.py puts this folder on sys.path)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest
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
