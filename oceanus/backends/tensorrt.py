"""TensorRT backend: serialized engines (`model.plan`) on an NVIDIA GPU.

The engine is deserialized once per instance on the instance's GPU; each instance owns an
execution context, a CUDA stream and device buffers that grow to the largest batch seen. Tensors
are bound by name (TensorRT >= 8.5's I/O tensor API: set_input_shape, set_tensor_address,
execute_async_v3). Host <-> device copies and the execution are queued on the instance's stream
and the thread waits for the stream once per batch. CUDA is driven through cuda-python's runtime
bindings.

TensorRT needs an NVIDIA GPU and its driver: without one, loading fails and says so (TensorRT is
imported only then, so a machine without a GPU is told about the GPU, not about a package).
Auto-complete fills inputs, outputs and max_batch_size from the engine, as Triton does.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.backends._common import check_dims
from oceanus.core import datatypes
from oceanus.core.backend import Backend, BatchInstance, LoadContext
from oceanus.core.errors import internal, invalid_arg, unavailable

log = logging.getLogger("oceanus.backends.tensorrt")

# TensorRT DataType names -> ModelConfig datatypes.
TRT_TO_CONFIG: dict[str, str] = {
    "FLOAT": "TYPE_FP32",
    "HALF": "TYPE_FP16",
    "BF16": "TYPE_BF16",
    "INT8": "TYPE_INT8",
    "UINT8": "TYPE_UINT8",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "BOOL": "TYPE_BOOL",
}


def _cudart() -> Any:
    """cuda-python's runtime module (its location moved in cuda-python 12.6)."""
    try:
        from cuda.bindings import runtime
    except ImportError:
        from cuda import cudart as runtime
    return runtime


def gpu_count() -> int:
    """NVIDIA GPUs usable through the CUDA runtime (0 without a driver or cuda-python)."""
    try:
        runtime = _cudart()
        error, count = runtime.cudaGetDeviceCount()
    except Exception:
        return 0
    if int(error) != 0:
        return 0
    return int(count)


def _check(result: Any, doing: str) -> Any:
    """cuda-python calls return (error, values...): raise on an error, return the values."""
    error = result[0] if isinstance(result, tuple) else result
    if int(error) != 0:
        raise internal(f"CUDA error during {doing}: {error}")
    if isinstance(result, tuple):
        return result[1] if len(result) == 2 else result[1:]
    return None


def _no_gpu(model: str) -> Exception:
    return unavailable(
        f"unable to load model '{model}': the TensorRT backend requires an NVIDIA GPU, and "
        "none is available to this process (no CUDA device found)"
    )


def _import_tensorrt(model: str) -> Any:
    try:
        import tensorrt
    except ImportError:
        raise invalid_arg(
            f"unable to load model '{model}': backend 'tensorrt' needs TensorRT: "
            "pip install oceanus[tensorrt]"
        ) from None
    try:
        _cudart()
    except ImportError:
        raise invalid_arg(
            f"unable to load model '{model}': backend 'tensorrt' needs cuda-python: "
            "pip install oceanus[tensorrt]"
        ) from None
    return tensorrt


class _Engine:
    """A deserialized engine and what the config checks need from it."""

    def __init__(self, trt: Any, engine: Any) -> None:
        self.trt = trt
        self.engine = engine
        self.inputs: dict[str, tuple[str, list[int]]] = {}
        self.outputs: dict[str, tuple[str, list[int]]] = {}
        for index in range(engine.num_io_tensors):
            name = engine.get_tensor_name(index)
            dtype = TRT_TO_CONFIG.get(engine.get_tensor_dtype(name).name, "TYPE_INVALID")
            shape = [int(d) for d in engine.get_tensor_shape(name)]
            if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
                self.inputs[name] = (dtype, shape)
            else:
                self.outputs[name] = (dtype, shape)

    def max_batch(self) -> int:
        """The largest first dimension optimization profile 0 allows for every input."""
        if self.engine.num_optimization_profiles < 1:
            return 0
        largest = None
        for name, (_, shape) in self.inputs.items():
            if not shape or shape[0] != -1:
                return 0
            _, _, high = self.engine.get_tensor_profile_shape(name, 0)
            largest = int(high[0]) if largest is None else min(largest, int(high[0]))
        return largest or 0


class TensorRTBackend(Backend):
    name = "tensorrt"
    default_model_filename = "model.plan"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runtime: Any = None

    def gpu_available(self) -> bool:
        return gpu_count() > 0

    def _deserialize(self, config: mc.ModelConfig, model_path: Path, device_id: int) -> _Engine:
        if gpu_count() == 0:
            raise _no_gpu(config.name)
        trt = _import_tensorrt(config.name)
        runtime_api = _cudart()
        _check(runtime_api.cudaSetDevice(device_id), "cudaSetDevice")
        with self._lock:
            if self._runtime is None:
                self._runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        engine = self._runtime.deserialize_cuda_engine(model_path.read_bytes())
        if engine is None:
            raise invalid_arg(
                f"unable to load model '{config.name}': TensorRT could not deserialize "
                f"'{model_path.name}' (built by another TensorRT version or for another GPU?)"
            )
        return _Engine(trt, engine)

    # ---- config checks ------------------------------------------------------------------------

    def complete_config(self, config: mc.ModelConfig, model_path: Path, autocomplete: bool) -> None:
        device = 0
        for group in config.instance_group:
            if group.gpus:
                device = group.gpus[0]
                break
        engine = self._deserialize(config, model_path, device)
        if autocomplete:
            self._autocomplete(config, engine)
        self._check(config, engine)

    def _autocomplete(self, config: mc.ModelConfig, engine: _Engine) -> None:
        if config.max_batch_size == 0 and not config.input and not config.output:
            largest = engine.max_batch()
            if largest > 1 and all(s[:1] == [-1] for _, s in engine.outputs.values()):
                config.max_batch_size = largest
                if not config.HasField("dynamic_batching") and not config.HasField(
                    "sequence_batching"
                ):
                    config.dynamic_batching.SetInParent()
        skip = 1 if config.max_batch_size > 0 else 0
        for model_tensors, tensors in (
            (engine.inputs, config.input),
            (engine.outputs, config.output),
        ):
            known = {t.name for t in tensors}
            for name, (dtype, shape) in model_tensors.items():
                if name in known:
                    continue
                added = tensors.add()
                added.name = name
                added.data_type = mc.DataType.Value(dtype)
                added.dims.extend(shape[skip:] or [1])

    def _check(self, config: mc.ModelConfig, engine: _Engine) -> None:
        name = config.name
        if len(engine.inputs) != len(config.input):
            raise invalid_arg(
                f"unable to load model '{name}', configuration expects {len(config.input)} "
                f"inputs, model provides {len(engine.inputs)}"
            )
        for kind, tensors, model_tensors in (
            ("input", config.input, engine.inputs),
            ("output", config.output, engine.outputs),
        ):
            for tensor in tensors:
                found = model_tensors.get(tensor.name)
                if found is None:
                    allowed = ", ".join(f"'{n}'" for n in model_tensors)
                    raise invalid_arg(
                        f"unable to load model '{name}', unexpected inference {kind} "
                        f"'{tensor.name}', allowed {kind}s are: {allowed}"
                    )
                dtype, shape = found
                config_type = mc.DataType.Name(tensor.data_type)
                if dtype != config_type:
                    raise invalid_arg(
                        f"unable to load model '{name}', configuration expects datatype "
                        f"{config_type} for {kind} '{tensor.name}', model provides {dtype}"
                    )
                check_dims(config, kind, tensor, shape)
        if config.max_batch_size > 0:
            largest = engine.max_batch()
            if largest and config.max_batch_size > largest:
                raise invalid_arg(
                    f"unable to load model '{name}', configuration specified max-batch "
                    f"{config.max_batch_size} but TensorRT engine only supports max-batch "
                    f"{largest}"
                )

    # ---- instances ----------------------------------------------------------------------------

    def load(self, context: LoadContext) -> BatchInstance:
        config, model_path, spec = context.config, context.files.model_path, context.spec
        if spec.kind != "GPU":
            if gpu_count() == 0:
                raise _no_gpu(config.name)
            group = next(
                (g for g in config.instance_group if spec.name.startswith(f"{g.name}_")), None
            )
            if group is not None and group.kind == mc.ModelInstanceGroup.KIND_CPU:
                raise invalid_arg(
                    f"unable to load model '{config.name}': TensorRT instances must be KIND_GPU "
                    f"(instance group '{group.name}' is KIND_CPU)"
                )
            # The core saw no GPU (it counts them with NVML) but CUDA does: run there.
            log.warning(
                "model '%s': instance '%s' was placed on the CPU, but TensorRT needs the GPU "
                "that CUDA reports: running it on GPU %d",
                config.name,
                spec.name,
                spec.device_id,
            )
        engine = self._deserialize(config, model_path, spec.device_id)
        return TensorRTInstance(config, engine, spec.device_id)


class _DeviceBuffer:
    def __init__(self) -> None:
        self.pointer = 0
        self.size = 0

    def ensure(self, runtime: Any, size: int) -> int:
        if size > self.size:
            self.free(runtime)
            self.pointer = int(_check(runtime.cudaMalloc(max(size, 1)), "cudaMalloc"))
            self.size = size
        return self.pointer

    def free(self, runtime: Any) -> None:
        if self.pointer:
            runtime.cudaFree(self.pointer)
        self.pointer = 0
        self.size = 0


class TensorRTInstance(BatchInstance):
    def __init__(self, config: mc.ModelConfig, engine: _Engine, device_id: int) -> None:
        self._runtime = _cudart()
        self._device_id = device_id
        self._engine = engine
        self._context = engine.engine.create_execution_context()
        if self._context is None:
            raise internal(f"unable to load model '{config.name}': no TensorRT execution context")
        self._stream = _check(self._runtime.cudaStreamCreate(), "cudaStreamCreate")
        self._stream_handle = int(self._stream)
        if engine.engine.num_optimization_profiles > 0:
            self._context.set_optimization_profile_async(0, self._stream_handle)
        self._buffers = {n: _DeviceBuffer() for n in (*engine.inputs, *engine.outputs)}
        self._outputs = [t.name for t in config.output]
        self._output_dtypes = {
            name: datatypes.BY_CONFIG_NAME[dtype].dtype
            for name, (dtype, _) in engine.outputs.items()
            if dtype in datatypes.BY_CONFIG_NAME
        }
        self._thread_id: int | None = None

    def execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        runtime = self._runtime
        if self._thread_id != threading.get_ident():
            # The CUDA device is per host thread: set it on the instance's execution thread.
            _check(runtime.cudaSetDevice(self._device_id), "cudaSetDevice")
            self._thread_id = threading.get_ident()
        host_to_device = runtime.cudaMemcpyKind.cudaMemcpyHostToDevice
        device_to_host = runtime.cudaMemcpyKind.cudaMemcpyDeviceToHost
        keep: list[np.ndarray] = []  # host arrays must outlive the queued copies
        for name, array in inputs.items():
            host = np.ascontiguousarray(array)
            keep.append(host)
            if not self._context.set_input_shape(name, tuple(host.shape)):
                raise invalid_arg(
                    f"input '{name}' shape {list(host.shape)} is outside the TensorRT engine's "
                    "optimization profile"
                )
            pointer = self._buffers[name].ensure(runtime, host.nbytes)
            _check(
                runtime.cudaMemcpyAsync(
                    pointer, host.ctypes.data, host.nbytes, host_to_device, self._stream
                ),
                "cudaMemcpyAsync (input)",
            )
            self._context.set_tensor_address(name, pointer)
        results: dict[str, np.ndarray] = {}
        for name in self._engine.outputs:
            shape = tuple(int(d) for d in self._context.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise internal(
                    f"output '{name}' has a data-dependent shape {list(shape)}, which the "
                    "TensorRT backend does not support"
                )
            host = np.empty(shape, dtype=self._output_dtypes[name])
            results[name] = host
            self._context.set_tensor_address(name, self._buffers[name].ensure(runtime, host.nbytes))
        if not self._context.execute_async_v3(self._stream_handle):
            raise internal("TensorRT failed to enqueue the inference")
        for name, host in results.items():
            _check(
                runtime.cudaMemcpyAsync(
                    host.ctypes.data,
                    self._buffers[name].pointer,
                    host.nbytes,
                    device_to_host,
                    self._stream,
                ),
                "cudaMemcpyAsync (output)",
            )
        _check(runtime.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")
        del keep
        return {name: results[name] for name in self._outputs if name in results}

    def close(self) -> None:
        runtime = self._runtime
        for buffer in self._buffers.values():
            buffer.free(runtime)
        if self._stream is not None:
            runtime.cudaStreamDestroy(self._stream)
            self._stream = None
        self._context = None
