"""ONNX Runtime backend: one InferenceSession per instance.

Sessions run on the instance's own thread; ONNX Runtime releases the GIL while it computes, so two
instances really execute at the same time.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from onnx import TensorProto
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.backends._common import check_dims, parameter
from oceanus.core import datatypes
from oceanus.core.backend import Backend, BatchInstance, InstanceSpec, LoadContext, model_file
from oceanus.core.errors import invalid_arg
from oceanus.core.repository.model_config import sequence_control_types, sequence_state_outputs

log = logging.getLogger("oceanus.backends.onnxruntime")

# ONNX Runtime's type strings -> ModelConfig datatype names.
ORT_TO_CONFIG: dict[str, str] = {
    "tensor(bool)": "TYPE_BOOL",
    "tensor(uint8)": "TYPE_UINT8",
    "tensor(uint16)": "TYPE_UINT16",
    "tensor(uint32)": "TYPE_UINT32",
    "tensor(uint64)": "TYPE_UINT64",
    "tensor(int8)": "TYPE_INT8",
    "tensor(int16)": "TYPE_INT16",
    "tensor(int32)": "TYPE_INT32",
    "tensor(int64)": "TYPE_INT64",
    "tensor(float16)": "TYPE_FP16",
    "tensor(float)": "TYPE_FP32",
    "tensor(double)": "TYPE_FP64",
    "tensor(string)": "TYPE_STRING",
    "tensor(bfloat16)": "TYPE_BF16",
}

_GRAPH_LEVELS = {
    -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    0: ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
}


def _model_dims(shape: Sequence[Any]) -> list[int]:
    """ORT shapes hold ints, symbolic names or None; Triton writes every unknown as -1."""
    return [d if isinstance(d, int) and d >= 0 else -1 for d in shape]


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"
    default_model_filename = "model.onnx"

    def __init__(self) -> None:
        self._warned_gpu_fallback = False
        self._warned_accelerators: set[tuple[str, str]] = set()

    def gpu_available(self) -> bool:
        return "CUDAExecutionProvider" in ort.get_available_providers()

    def model_path(self, config: mc.ModelConfig, version_dir: Path) -> Path:
        # Triton also accepts a folder holding model.onnx (external data).
        return model_file(config, version_dir, "model.onnx", folder_holds="model.onnx")

    def complete_config(self, config: mc.ModelConfig, model_path: Path, autocomplete: bool) -> None:
        session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
        # The sequence batcher's control inputs are model inputs the config does not list.
        controls = sequence_control_types(config)
        self._check_controls(config, controls, session.get_inputs())
        model_inputs = {i.name: i for i in session.get_inputs() if i.name not in controls}
        # Implicit state outputs are model outputs the config does not list either.
        state_outputs = sequence_state_outputs(config)
        model_outputs = {o.name: o for o in session.get_outputs() if o.name not in state_outputs}
        for name in state_outputs - {o.name for o in session.get_outputs()}:
            raise invalid_arg(
                f"unable to load model '{config.name}', sequence batching state output "
                f"'{name}' is not an output of the model"
            )
        if autocomplete:
            self._autocomplete(config, list(model_inputs.values()), list(model_outputs.values()))
        self._check(config, "input", config.input, model_inputs)
        self._check(config, "output", config.output, model_outputs)
        for name in model_inputs:
            if not any(t.name == name for t in config.input):
                raise invalid_arg(
                    f"unable to load model '{config.name}', configuration expects "
                    f"{len(config.input)} inputs, model provides {len(model_inputs)}: "
                    f"input '{name}' is missing from the configuration"
                )

    def _autocomplete(self, config: mc.ModelConfig, inputs: list[Any], outputs: list[Any]) -> None:
        """Fill inputs/outputs the config leaves out, as Triton's ONNX Runtime backend does."""
        if config.max_batch_size == 0 and not config.input and not config.output:
            batchable = all(_model_dims(t.shape)[:1] == [-1] for t in inputs + outputs)
            if batchable and inputs:
                config.max_batch_size = 4
                if not config.HasField("dynamic_batching") and not config.HasField(
                    "sequence_batching"
                ):
                    config.dynamic_batching.SetInParent()
        skip = 1 if config.max_batch_size > 0 else 0
        for kind, model_tensors, config_tensors in (
            ("input", inputs, config.input),
            ("output", outputs, config.output),
        ):
            known = {t.name for t in config_tensors}
            for tensor in model_tensors:
                if tensor.name in known:
                    continue
                added = config_tensors.add()
                added.name = tensor.name
                added.data_type = mc.DataType.Value(ORT_TO_CONFIG.get(tensor.type, "TYPE_INVALID"))
                dims = _model_dims(tensor.shape)[skip:]
                added.dims.extend(dims or [1])
                log.debug("autocompleted %s '%s' of model '%s'", kind, tensor.name, config.name)
            for tensor in config_tensors:
                if tensor.data_type == mc.TYPE_INVALID or not tensor.dims:
                    match = next((t for t in model_tensors if t.name == tensor.name), None)
                    if match is not None and tensor.data_type == mc.TYPE_INVALID:
                        tensor.data_type = mc.DataType.Value(ORT_TO_CONFIG[match.type])
                    if match is not None and not tensor.dims:
                        tensor.dims.extend(_model_dims(match.shape)[skip:] or [1])

    def _check_controls(
        self, config: mc.ModelConfig, controls: dict[str, str], model_inputs: list[Any]
    ) -> None:
        types = {i.name: i.type for i in model_inputs}
        for name, datatype in controls.items():
            if name not in types:
                raise invalid_arg(
                    f"unable to load model '{config.name}', sequence batching control input "
                    f"'{name}' is not an input of the model"
                )
            model_type = ORT_TO_CONFIG.get(types[name], types[name])
            expected = "TYPE_" + datatype.replace("BYTES", "STRING")
            if model_type != expected:
                raise invalid_arg(
                    f"unable to load model '{config.name}', sequence batching control input "
                    f"'{name}' is {expected}, model provides {model_type}"
                )

    def _check(
        self,
        config: mc.ModelConfig,
        kind: str,
        tensors: Sequence[Any],
        model_tensors: dict[str, Any],
    ) -> None:
        for tensor in tensors:
            model_tensor = model_tensors.get(tensor.name)
            if model_tensor is None:
                allowed = ", ".join(f"'{n}'" for n in model_tensors)
                raise invalid_arg(
                    f"unable to load model '{config.name}', unexpected inference {kind} "
                    f"'{tensor.name}', allowed {kind}s are: {allowed}"
                )
            model_type = ORT_TO_CONFIG.get(model_tensor.type, model_tensor.type)
            config_type = mc.DataType.Name(tensor.data_type)
            if model_type != config_type:
                raise invalid_arg(
                    f"unable to load model '{config.name}', configuration expects datatype "
                    f"{config_type} for {kind} '{tensor.name}', model provides {model_type}"
                )
            check_dims(config, kind, tensor, _model_dims(model_tensor.shape))

    def load(self, context: LoadContext) -> BatchInstance:
        config, model_path, spec = context.config, context.files.model_path, context.spec
        options = ort.SessionOptions()
        intra = parameter(config, "intra_op_thread_count")
        inter = parameter(config, "inter_op_thread_count")
        options.intra_op_num_threads = int(intra) if intra else spec.cpu_threads
        options.inter_op_num_threads = int(inter) if inter else 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        level = config.optimization.graph.level if config.optimization.HasField("graph") else 0
        options.graph_optimization_level = _GRAPH_LEVELS.get(
            level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        )
        options.log_severity_level = 3
        # Spinning worker threads would burn the cores the event loop and the other instances
        # need; they sleep instead (measured in bench/README.md).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        providers = self._execution_providers(config, spec)
        session = ort.InferenceSession(str(model_path), sess_options=options, providers=providers)
        return OnnxRuntimeInstance(session, config)

    # ---- execution accelerators (optimization.execution_accelerators) ------------------------

    def _execution_providers(self, config: mc.ModelConfig, spec: InstanceSpec) -> list[Any]:
        """ORT providers for an instance, from the config's execution accelerators as Triton's
        ONNX Runtime backend maps them: gpu ["tensorrt", "cuda"] on GPU instances, cpu
        ["openvino"] on every instance. An accelerator this ONNX Runtime build lacks is skipped
        with a warning (Triton fails the load); an unknown name fails the load, as in Triton."""
        accelerators = config.optimization.execution_accelerators
        available = set(ort.get_available_providers())
        providers: list[Any] = []
        gpu_requested = any(g.kind == mc.ModelInstanceGroup.KIND_GPU for g in config.instance_group)
        if spec.kind == "GPU" or gpu_requested:
            cuda_options: dict[str, str] = {"device_id": str(spec.device_id)}
            for accelerator in accelerators.gpu_execution_accelerator:
                if accelerator.name == "tensorrt":
                    if spec.kind == "GPU" and self._accelerator_usable(
                        config, accelerator.name, "TensorrtExecutionProvider", available
                    ):
                        providers.append(
                            (
                                "TensorrtExecutionProvider",
                                _tensorrt_options(accelerator.parameters, spec.device_id),
                            )
                        )
                elif accelerator.name == "cuda":
                    cuda_options.update(accelerator.parameters)
                else:
                    raise invalid_arg(
                        f"unknown Execution Accelerator '{accelerator.name}' is requested"
                    )
            if spec.kind == "GPU":
                providers.append(("CUDAExecutionProvider", cuda_options))
        for accelerator in accelerators.cpu_execution_accelerator:
            if accelerator.name != "openvino":
                raise invalid_arg(
                    f"unknown Execution Accelerator '{accelerator.name}' is requested"
                )
            if self._accelerator_usable(
                config, accelerator.name, "OpenVINOExecutionProvider", available
            ):
                providers.append(("OpenVINOExecutionProvider", {"device_type": "CPU"}))
        providers.append("CPUExecutionProvider")
        return providers

    def _accelerator_usable(
        self, config: mc.ModelConfig, name: str, provider: str, available: set[str]
    ) -> bool:
        if provider in available:
            log.info(
                "model '%s': %s execution accelerator enabled (%s)", config.name, name, provider
            )
            return True
        key = (config.name, name)
        if key not in self._warned_accelerators:
            self._warned_accelerators.add(key)
            log.warning(
                "model '%s': execution accelerator '%s' requested but this ONNX Runtime build "
                "has no %s (available: %s); running without it",
                config.name,
                name,
                provider,
                ", ".join(sorted(available)),
            )
        return False


# Triton's TensorRT accelerator parameters -> ONNX Runtime TensorRT provider options.
_TRT_RENAMED = {
    "max_workspace_size_bytes": "trt_max_workspace_size",
    "int8_calibration_table_name": "trt_int8_calibration_table_name",
    "int8_use_native_calibration_table": "trt_int8_use_native_calibration_table",
}
_TRT_PRECISION = {"FP16": "trt_fp16_enable", "BF16": "trt_bf16_enable", "INT8": "trt_int8_enable"}


def _tensorrt_options(parameters: Any, device_id: int) -> dict[str, str]:
    options = {"device_id": str(device_id)}
    for key, value in parameters.items():
        if key == "precision_mode":
            flag = _TRT_PRECISION.get(value.upper())
            if flag is None and value.upper() != "FP32":
                raise invalid_arg(
                    f"unsupported precision mode '{value}' is requested for TensorRT; allowed "
                    "values are FP32, FP16, BF16 and INT8"
                )
            if flag is not None:
                options[flag] = "True"
        else:
            options[_TRT_RENAMED.get(key, key)] = value
    return options


_InvalidArgument = getattr(
    getattr(ort.capi, "onnxruntime_pybind11_state", None), "InvalidArgument", ValueError
)


class OnnxRuntimeInstance(BatchInstance):
    def __init__(self, session: ort.InferenceSession, config: mc.ModelConfig) -> None:
        self._session = session
        self._output_names = [o.name for o in session.get_outputs()]
        self._input_types = {i.name: i.type for i in session.get_inputs()}
        output_types = {o.name: o.type for o in session.get_outputs()}
        types = set(self._input_types.values()) | set(output_types.values())
        # BF16 has no numpy type inside ORT's Python binding: those go through OrtValues.
        self._uses_ortvalues = "tensor(bfloat16)" in types
        # Only string tensors need converting on the way in and out (see _to_ort, _from_ort).
        self._converts = "tensor(string)" in types
        # The binding's own run() for CPU-only sessions: InferenceSession.run re-checks the
        # feed the core has already validated (a tenth of a tiny model's path; bench/README.md,
        # "Figures behind code comments") and adds an execution-provider fallback only GPU
        # providers use.
        binding = getattr(session, "_sess", None)
        self._run: Callable[[list[str], dict[str, Any]], list[Any]]
        if binding is not None and session.get_providers() == ["CPUExecutionProvider"]:
            options = ort.RunOptions()
            self._run = lambda names, feed: binding.run(names, feed, options)
        else:
            self._run = session.run

    def execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            return self._execute(inputs)
        except _InvalidArgument as exc:
            # The request's values were wrong (token ids outside the vocabulary, say): the
            # client's mistake, reported with ONNX Runtime's words as Triton reports them.
            text = str(exc).split("INVALID_ARGUMENT : ", 1)[-1]
            raise invalid_arg(f"onnx runtime error 2: {text}") from None

    def _execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._uses_ortvalues:
            return self._execute_ortvalues(inputs)
        if not self._converts:
            return dict(zip(self._output_names, self._run(self._output_names, inputs), strict=True))
        feed = {name: self._to_ort(name, array) for name, array in inputs.items()}
        results = self._session.run(self._output_names, feed)
        return {
            name: self._from_ort(value)
            for name, value in zip(self._output_names, results, strict=True)
        }

    def _to_ort(self, name: str, array: np.ndarray) -> np.ndarray:
        if array.dtype == np.dtype(object):
            # ORT's string tensors take str; bytes would be stringified as "b'..'".
            try:
                return np.array(
                    [b.decode() if isinstance(b, bytes) else b for b in array.reshape(-1)],
                    dtype=object,
                ).reshape(array.shape)
            except UnicodeDecodeError:
                raise invalid_arg(
                    f"input '{name}' holds bytes that are not valid UTF-8, which ONNX Runtime "
                    "string tensors cannot carry"
                ) from None
        return array

    @staticmethod
    def _from_ort(value: np.ndarray) -> np.ndarray:
        if value.dtype == np.dtype(object):
            return np.array(
                [v.encode() if isinstance(v, str) else v for v in value.reshape(-1)], dtype=object
            ).reshape(value.shape)
        return value

    def _execute_ortvalues(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feed = {}
        for name, array in inputs.items():
            if self._input_types.get(name) == "tensor(bfloat16)":
                feed[name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                    np.ascontiguousarray(array).view(np.uint16), TensorProto.BFLOAT16
                )
            else:
                feed[name] = ort.OrtValue.ortvalue_from_numpy(self._to_ort(name, array))
        results = self._session.run_with_ort_values(self._output_names, feed)
        outputs: dict[str, np.ndarray] = {}
        for name, value in zip(self._output_names, results, strict=True):
            if value.element_type() == TensorProto.BFLOAT16:
                shape = tuple(value.shape())
                size = int(np.prod(shape)) * 2
                raw = ctypes.string_at(value.data_ptr(), size) if size else b""
                outputs[name] = (
                    np.frombuffer(raw, dtype=np.uint16)
                    .view(datatypes.BY_NAME["BF16"].dtype)
                    .reshape(shape)
                )
            else:
                outputs[name] = self._from_ort(value.numpy())
        return outputs
