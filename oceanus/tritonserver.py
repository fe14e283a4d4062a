"""NVIDIA's `tritonserver` in-process API under its own names, served by Oceanus.

`import oceanus.tritonserver as tritonserver` in place of `import tritonserver` runs code
written for Triton's package: `Server(model_repository=...)` or `Server(Options(...))`,
`start()`, `models()`, `model(name).infer(inputs={...})`, `numpy.from_dlpack(output)`,
`to_string_array()`. What differs is listed in docs/embedded.md.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from oceanus.core.scheduling.rate_limiter import ResourceLimit
from oceanus.embedded.errors import (
    AlreadyExistsError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    TritonError,
    UnavailableError,
    UnknownError,
    UnsupportedError,
)
from oceanus.embedded.model import Model, ModelBatchFlag, ModelTxnPropertyFlag
from oceanus.embedded.options import settings_from_options
from oceanus.embedded.requests import InferenceRequest, InferenceResponse
from oceanus.embedded.server import Server as _EmbeddedServer
from oceanus.embedded.tensor import DataType, MemoryType, Tensor
from oceanus.settings import Settings

__all__ = [
    "AlreadyExistsError",
    "DataType",
    "InferenceRequest",
    "InferenceResponse",
    "InstanceGroupKind",
    "InternalError",
    "InvalidArgumentError",
    "LogFormat",
    "MemoryType",
    "MetricFormat",
    "Model",
    "ModelBatchFlag",
    "ModelControlMode",
    "ModelTxnPropertyFlag",
    "NotFoundError",
    "Options",
    "RateLimitMode",
    "RateLimiterResource",
    "Server",
    "Tensor",
    "TritonError",
    "UnavailableError",
    "UnknownError",
    "UnsupportedError",
]


class ModelControlMode(enum.IntEnum):
    NONE = 0
    POLL = 1
    EXPLICIT = 2


class RateLimitMode(enum.IntEnum):
    OFF = 0
    EXEC_COUNT = 1


class LogFormat(enum.IntEnum):
    DEFAULT = 0
    ISO8601 = 1


class MetricFormat(enum.IntEnum):
    PROMETHEUS = 0


class InstanceGroupKind(enum.IntEnum):
    AUTO = 0
    CPU = 1
    GPU = 2
    MODEL = 3


@dataclass
class RateLimiterResource:
    name: str
    count: int
    device: int


@dataclass
class Options:
    """Triton's server options. Those of features Oceanus does not have (GPU memory pools,
    backend and repo agent folders, host policies, ...) are accepted and ignored, as the
    command line accepts their flags."""

    model_repository: str | list[str] = field(default_factory=list)
    server_id: str = "triton"
    model_control_mode: ModelControlMode = ModelControlMode.NONE
    startup_models: list[str] = field(default_factory=list)
    strict_model_config: bool = False
    rate_limiter_mode: RateLimitMode = RateLimitMode.OFF
    rate_limiter_resources: list[RateLimiterResource] = field(default_factory=list)
    pinned_memory_pool_size: int = 1 << 28
    cuda_memory_pool_sizes: dict[int, int] = field(default_factory=dict)
    cache_config: dict[str, dict[str, Any]] = field(default_factory=dict)
    cache_directory: str = "/opt/tritonserver/caches"
    min_supported_compute_capability: float = 6.0
    exit_on_error: bool = True
    strict_readiness: bool = True
    exit_timeout: int = 30
    buffer_manager_thread_count: int = 0
    model_load_thread_count: int = 4
    model_load_retry_count: int = 0
    model_namespacing: bool = False
    enable_peer_access: bool = True
    log_file: str | None = None
    log_info: bool = False
    log_warn: bool = False
    log_error: bool = False
    log_format: LogFormat = LogFormat.DEFAULT
    log_verbose: int = 0
    metrics: bool = True
    gpu_metrics: bool = True
    cpu_metrics: bool = True
    metrics_interval: int = 2000
    backend_directory: str = "/opt/tritonserver/backends"
    repo_agent_directory: str = "/opt/tritonserver/repoagents"
    model_load_device_limits: list[Any] = field(default_factory=list)
    backend_configuration: dict[str, dict[str, str]] = field(default_factory=dict)
    host_policies: dict[str, dict[str, str]] = field(default_factory=dict)
    metrics_configuration: dict[str, dict[str, str]] = field(default_factory=dict)

    def _settings(self) -> Settings:
        repositories = self.model_repository
        if isinstance(repositories, str):
            repositories = [repositories]
        if not isinstance(repositories, list) or not all(isinstance(r, str) for r in repositories):
            raise TypeError("model_repository must be a str or a list of str")
        if not isinstance(self.server_id, str):
            raise TypeError("server_id must be a str")
        # Triton turns a level on with every level above it.
        info = self.log_info or self.log_verbose > 0
        warn = self.log_warn or info
        error = self.log_error or warn
        # Triton's option names to the flags' keywords: checked as `oceanus.Server(...)` checks
        # them, into the same Settings.
        local = self.cache_config.get("local")
        return settings_from_options(
            {
                "model_repository": list(repositories),
                "id": self.server_id,
                "model_control_mode": ModelControlMode(self.model_control_mode).name.lower(),
                "load_model": list(self.startup_models),
                "strict_model_config": self.strict_model_config,
                "rate_limit": "execution_count"
                if self.rate_limiter_mode == RateLimitMode.EXEC_COUNT
                else "off",
                "rate_limit_resource": [
                    ResourceLimit(r.name, r.count, r.device) for r in self.rate_limiter_resources
                ],
                "cache_config": [f"local,size={int(local.get('size', 0))}"] if local else [],
                "exit_on_error": self.exit_on_error,
                "strict_readiness": self.strict_readiness,
                "exit_timeout_secs": self.exit_timeout,
                "model_load_thread_count": self.model_load_thread_count,
                "model_namespacing": self.model_namespacing,
                "allow_metrics": self.metrics,
                "allow_gpu_metrics": self.gpu_metrics,
                "allow_cpu_metrics": self.cpu_metrics,
                "metrics_interval_ms": self.metrics_interval,
                "metrics_config": {
                    key: str(value)
                    for settings in self.metrics_configuration.values()
                    for key, value in settings.items()
                },
                "log_verbose": self.log_verbose,
                "log_info": info,
                "log_warning": warn,
                "log_error": error,
                "log_format": "ISO8601" if self.log_format == LogFormat.ISO8601 else "default",
                "log_file": self.log_file or "",
            }
        )


class Server(_EmbeddedServer):
    """Triton's `tritonserver.Server`: options as an `Options` or its fields as keywords;
    they are read at `start()`, as Triton reads them."""

    def __init__(self, options: Options | None = None, **kwargs: Any) -> None:
        self.options = options if options is not None else Options(**kwargs)
        super().__init__(Settings())

    def start(
        self,
        wait_until_ready: bool = False,
        polling_interval: float = 0.1,
        timeout: float | None = None,
    ) -> Server:
        self.settings = self.options._settings()
        super().start(wait_until_ready, polling_interval, timeout)
        return self
