"""The RPCs of `inference.GRPCInferenceService` by name, and Triton's restricted-protocol check:
shared by the in-process gRPC frontend and the frontend worker processes, which forward these
methods to the core process; and the handler that maps a unary RPC's errors to statuses."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

import grpc
from tritonclient.grpc import service_pb2 as pb

from oceanus.frontends.grpc.errors import failure_status

# grpc.aio.ServicerContext (grpcio ships no type information)
Context: TypeAlias = Any

SERVICE_NAME = "inference.GRPCInferenceService"

# The unary RPCs of inference.GRPCInferenceService: (method, restricted-API group, the
# GrpcService method serving it, request message type). The frontend worker processes forward
# the same methods to the core process.
UNARY_METHODS: list[tuple[str, str, str, Any]] = [
    ("ServerLive", "health", "server_live", pb.ServerLiveRequest),
    ("ServerReady", "health", "server_ready", pb.ServerReadyRequest),
    ("ModelReady", "health", "model_ready", pb.ModelReadyRequest),
    ("ServerMetadata", "metadata", "server_metadata", pb.ServerMetadataRequest),
    ("ModelMetadata", "metadata", "model_metadata", pb.ModelMetadataRequest),
    ("ModelConfig", "model-config", "model_config", pb.ModelConfigRequest),
    ("ModelStatistics", "statistics", "model_statistics", pb.ModelStatisticsRequest),
    ("RepositoryIndex", "model-repository", "repository_index", pb.RepositoryIndexRequest),
    (
        "RepositoryModelLoad",
        "model-repository",
        "repository_model_load",
        pb.RepositoryModelLoadRequest,
    ),
    (
        "RepositoryModelUnload",
        "model-repository",
        "repository_model_unload",
        pb.RepositoryModelUnloadRequest,
    ),
    (
        "SystemSharedMemoryStatus",
        "shared-memory",
        "system_shm_status",
        pb.SystemSharedMemoryStatusRequest,
    ),
    (
        "SystemSharedMemoryRegister",
        "shared-memory",
        "system_shm_register",
        pb.SystemSharedMemoryRegisterRequest,
    ),
    (
        "SystemSharedMemoryUnregister",
        "shared-memory",
        "system_shm_unregister",
        pb.SystemSharedMemoryUnregisterRequest,
    ),
    (
        "CudaSharedMemoryStatus",
        "shared-memory",
        "cuda_shm_status",
        pb.CudaSharedMemoryStatusRequest,
    ),
    (
        "CudaSharedMemoryRegister",
        "shared-memory",
        "cuda_shm_register",
        pb.CudaSharedMemoryRegisterRequest,
    ),
    (
        "CudaSharedMemoryUnregister",
        "shared-memory",
        "cuda_shm_unregister",
        pb.CudaSharedMemoryUnregisterRequest,
    ),
    ("TraceSetting", "trace", "trace_setting", pb.TraceSettingRequest),
    ("LogSettings", "logging", "log_settings_rpc", pb.LogSettingsRequest),
]


def restricted(rules: dict[str, tuple[str, str]], category: str, handler: Any) -> Any:
    """`handler`, refusing calls without the metadata its API group needs
    (--grpc-restricted-protocol), with Triton's status and text."""
    rule = rules.get(category)
    if rule is None:
        return handler
    header, value = rule
    denied = f"This protocol is restricted, expecting header '{header}'"

    async def checked(request: Any, context: Context) -> Any:
        for key, given in context.invocation_metadata() or ():
            if key == header and given == value:
                return await handler(request, context)
        await context.abort(grpc.StatusCode.UNAVAILABLE, denied)

    return checked


Unary = Callable[[Any, Context], Awaitable[Any]]


def unary_handler(name: str, body: Callable[[Any], Any]) -> Unary:
    """An RPC handler around a function of the request (plain or async), mapping its errors."""
    is_async = inspect.iscoroutinefunction(body)

    async def handler(request: Any, context: Context) -> Any:
        try:
            if is_async:
                return await body(request)
            return body(request)
        except Exception as exc:
            code, message = failure_status(exc, name)
        await context.abort(code, message)

    return handler
