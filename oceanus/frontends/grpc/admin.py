"""The administrative RPCs of `inference.GRPCInferenceService`: the model repository, shared
memory regions, trace settings and log settings. GrpcService (service.py) inherits them; its
inference and health RPCs stay there.

System shared memory regions live in the core (core/shared_memory.py); CUDA shared memory
answers as Triton does on a machine without a usable CUDA driver.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb

from oceanus.core.errors import invalid_arg, unavailable, unsupported
from oceanus.core.observability.tracing import TraceSettingError
from oceanus.core.server import ServerCore
from oceanus.frontends.log_settings import (
    BadLogSetting,
    apply_log_settings,
    log_settings_document,
    updated_log_settings,
)
from oceanus.frontends.trace_settings import unknown_model, update_from_grpc
from oceanus.logs import LogSettings

# Triton's texts for the features that are off.
NO_LOGGING = "the server does not support dynamic logging"
# LogSettings keys, the SettingValue field each must use, and Triton's word for it in errors.
_LOG_SETTING_KINDS = (
    ("log_file", "string_param", "string"),
    ("log_info", "bool_param", "boolean"),
    ("log_warning", "bool_param", "boolean"),
    ("log_error", "bool_param", "boolean"),
    ("log_verbose_level", "uint32_param", "int32"),
    ("log_format", "string_param", "string"),
)
NO_REPOSITORY_NAME = "'repository_name' specification is not supported"


class AdminRpcs:
    """Repository, shared memory, trace and log settings RPCs over the core."""

    core: ServerCore
    log_settings: LogSettings | None  # the server's live settings; None: LogSettings is off

    # ---- repository -------------------------------------------------------------------------

    def repository_index(self, request: pb.RepositoryIndexRequest) -> pb.RepositoryIndexResponse:
        if request.repository_name:
            raise unsupported(NO_REPOSITORY_NAME)
        index = self.core.repository_index(request.ready)
        return json_format.ParseDict(
            {"models": index}, pb.RepositoryIndexResponse(), ignore_unknown_fields=True
        )

    async def repository_model_load(
        self, request: pb.RepositoryModelLoadRequest
    ) -> pb.RepositoryModelLoadResponse:
        if request.repository_name:
            raise unsupported(NO_REPOSITORY_NAME)
        config: str | None = None
        files: dict[str, bytes] = {}
        for key, parameter in request.parameters.items():
            kind = parameter.WhichOneof("parameter_choice")
            if key == "config":
                if kind != "string_param":
                    raise invalid_arg(
                        f"invalid value type for load parameter '{key}', expected string_param."
                    )
                config = parameter.string_param
            elif key.startswith("file:"):
                if kind != "bytes_param":
                    raise invalid_arg(
                        f"invalid value type for load parameter '{key}', expected bytes_param."
                    )
                files[key[len("file:") :]] = parameter.bytes_param
            else:
                raise invalid_arg(f"unrecognized load parameter '{key}'.")
        await self.core.load_model(request.model_name, config, files or None)
        return pb.RepositoryModelLoadResponse()

    async def repository_model_unload(
        self, request: pb.RepositoryModelUnloadRequest
    ) -> pb.RepositoryModelUnloadResponse:
        if request.repository_name:
            raise unsupported(NO_REPOSITORY_NAME)
        dependents = request.parameters.get("unload_dependents")
        if dependents is not None and dependents.WhichOneof("parameter_choice") != "bool_param":
            raise invalid_arg(
                "invalid value type for 'unload_dependents' parameter, expected bool_param."
            )
        await self.core.unload_model(request.model_name)
        return pb.RepositoryModelUnloadResponse()

    # ---- shared memory ----------------------------------------------------------------------

    def system_shm_status(
        self, request: pb.SystemSharedMemoryStatusRequest
    ) -> pb.SystemSharedMemoryStatusResponse:
        response = pb.SystemSharedMemoryStatusResponse()
        for region in self.core.shared_memory.status(request.name):
            response.regions[region["name"]].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(**region)
            )
        return response

    def system_shm_register(
        self, request: pb.SystemSharedMemoryRegisterRequest
    ) -> pb.SystemSharedMemoryRegisterResponse:
        self.core.shared_memory.register(
            request.name, request.key, request.offset, request.byte_size
        )
        return pb.SystemSharedMemoryRegisterResponse()

    def system_shm_unregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        if request.name:
            self.core.shared_memory.unregister(request.name)
        else:
            self.core.shared_memory.unregister_all()
        return pb.SystemSharedMemoryUnregisterResponse()

    def cuda_shm_status(
        self, request: pb.CudaSharedMemoryStatusRequest
    ) -> pb.CudaSharedMemoryStatusResponse:
        self.core.shared_memory.cuda_status(request.name)  # no CUDA region: only its errors
        return pb.CudaSharedMemoryStatusResponse()

    def cuda_shm_register(
        self, request: pb.CudaSharedMemoryRegisterRequest
    ) -> pb.CudaSharedMemoryRegisterResponse:
        self.core.shared_memory.register_cuda(request.name)  # always fails: no CUDA IPC
        return pb.CudaSharedMemoryRegisterResponse()

    def cuda_shm_unregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        return pb.CudaSharedMemoryUnregisterResponse()  # nothing is ever registered

    # ---- trace and logging ----------------------------------------------------------------------

    def trace_setting(self, request: pb.TraceSettingRequest) -> pb.TraceSettingResponse:
        """TraceSetting: Triton's trace extension, sharing its rules with HTTP."""
        name = request.model_name
        tracer = self.core.tracer
        try:
            if name and not self.core.model_ready(name):
                raise unknown_model(name)
            if request.settings:
                settings = {key: list(value.value) for key, value in request.settings.items()}
                tracer.update(name, update_from_grpc(settings))
        except TraceSettingError as exc:
            raise (unsupported if exc.code == "UNSUPPORTED" else invalid_arg)(exc.message) from None
        response = pb.TraceSettingResponse()
        for key, value in tracer.document(name).items():
            response.settings[key].value.extend(value if isinstance(value, list) else [value])
        return response

    def log_settings_rpc(self, request: pb.LogSettingsRequest) -> pb.LogSettingsResponse:
        """LogSettings: Triton's logging extension, sharing its rules with `/v2/logging`."""
        if self.log_settings is None:
            raise unavailable(NO_LOGGING)
        changes: dict[str, Any] = {}
        for key, kind, what in _LOG_SETTING_KINDS:
            if key in request.settings:
                value = request.settings[key]
                if key == "log_file":  # Triton refuses it whatever its type
                    raise unsupported(
                        "log file location can not be updated through network protocol"
                    )
                if value.WhichOneof("parameter_choice") != kind:
                    raise invalid_arg(f"expect {what} for '{key}'")
                changes[key] = getattr(value, kind)
        log_format = changes.get("log_format")
        if log_format is not None and log_format not in ("default", "ISO8601"):
            raise invalid_arg(f"invalid argument for log_format, got: {log_format}")
        try:
            new = updated_log_settings(self.log_settings, changes)
        except BadLogSetting as exc:  # unreachable after the checks above; kept for safety
            raise invalid_arg(exc.message) from None
        apply_log_settings(self.log_settings, new)
        response = pb.LogSettingsResponse()
        for key, current in log_settings_document(self.log_settings).items():
            kind = next(k for name, k, _ in _LOG_SETTING_KINDS if name == key)
            setattr(response.settings[key], kind, current)
        return response
