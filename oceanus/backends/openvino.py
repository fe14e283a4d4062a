"""OpenVINO backend: IR models (`model.xml` + `model.bin`), or any format OpenVINO reads
(`model.onnx`, ...) when the config's `default_model_filename` names it.

Follows Triton's OpenVINO backend:

- The model is compiled once per model version and device; each instance owns one infer request
  on it, so instances run in parallel on OpenVINO's streams. By default the compiled model gets
  one stream per instance and the cores the instances' share adds up to (INFERENCE_NUM_THREADS);
  the config's parameters override that: PERFORMANCE_HINT (LATENCY, THROUGHPUT,
  CUMULATIVE_THROUGHPUT), NUM_STREAMS (AUTO, NUMA or a number), INFERENCE_NUM_THREADS,
  COMPILATION_NUM_THREADS, HINT_BF16 (YES), CPU_EXTENSION_PATH, TARGET_DEVICE (default CPU),
  RESHAPE_IO_LAYERS (YES: reshape the model's inputs to the config's dims, -1 = dynamic), and
  (an Oceanus addition) ENABLE_CPU_PINNING (YES/NO; default NO, unlike OpenVINO's default).
- A config datatype that differs from the model's is converted by OpenVINO's pre/post-processing
  (as Triton's backend does); TYPE_STRING is not supported.
- Auto-complete fills inputs and outputs (name, datatype, dims) when the config lists none, and
  max_batch_size (4, with dynamic batching) when every input and output has a layout with a batch
  dimension ("N"), as Triton does (Triton also overrides an explicit max_batch_size: 0 in a config
  that lists its tensors; Oceanus keeps it).
- A batching model whose batch dimension is static in the file is reshaped to a dynamic batch.

OpenVINO's CPU plugin computes INT64 as INT32 (values beyond 32 bits are truncated) and FP64 as
FP32; that is OpenVINO's behaviour, not ours.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov
from openvino import preprocess
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.backends._common import (
    check_dims,
    config_dims,
    parameter,
    total_instances,
)
from oceanus.core import datatypes
from oceanus.core.backend import Backend, BatchInstance, LoadContext
from oceanus.core.errors import InferenceServerError, invalid_arg
from oceanus.core.types import is_number

log = logging.getLogger("oceanus.backends.openvino")

CONFIG_TO_OV: dict[str, ov.Type] = {
    "TYPE_BOOL": ov.Type.boolean,
    "TYPE_UINT8": ov.Type.u8,
    "TYPE_UINT16": ov.Type.u16,
    "TYPE_UINT32": ov.Type.u32,
    "TYPE_UINT64": ov.Type.u64,
    "TYPE_INT8": ov.Type.i8,
    "TYPE_INT16": ov.Type.i16,
    "TYPE_INT32": ov.Type.i32,
    "TYPE_INT64": ov.Type.i64,
    "TYPE_FP16": ov.Type.f16,
    "TYPE_FP32": ov.Type.f32,
    "TYPE_FP64": ov.Type.f64,
    "TYPE_BF16": ov.Type.bf16,
}
OV_TO_CONFIG: dict[str, str] = {str(v): k for k, v in CONFIG_TO_OV.items()}

DEFAULT_MAX_BATCH_SIZE = 4  # Triton's --backend-config=default-max-batch-size default
_BF16 = datatypes.BY_NAME["BF16"].dtype


def _config_type(element: ov.Type) -> str:
    return OV_TO_CONFIG.get(str(element), "TYPE_INVALID")


def _dims(shape: ov.PartialShape) -> list[int]:
    if shape.rank.is_dynamic:
        return []
    return [d.get_length() if d.is_static else -1 for d in shape]


def _find(ports: Sequence[Any], name: str) -> int | None:
    for index, port in enumerate(ports):
        if name in port.get_names():
            return index
    return None


def _ov_error(config: mc.ModelConfig, doing: str, exc: Exception) -> InferenceServerError:
    text = str(exc).strip()
    # OpenVINO's messages carry a C++ source trace; the first line that says something is enough.
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(("Check ", "/"))]
    detail = lines[-1] if lines else text
    return invalid_arg(f"unable to load model '{config.name}': {doing}: {detail}")


def _yes(config: mc.ModelConfig, key: str) -> bool:
    value = parameter(config, key)
    return value is not None and value.strip().lower() == "yes"


class _Compiled:
    """One compiled model shared by the instances of a model version (weakly cached)."""

    def __init__(self, compiled: Any) -> None:
        self.compiled = compiled


class OpenVinoBackend(Backend):
    name = "openvino"
    default_model_filename = "model.xml"

    def __init__(self) -> None:
        self._core = ov.Core()
        self._lock = threading.Lock()
        self._compiled: weakref.WeakValueDictionary[tuple[Any, ...], _Compiled] = (
            weakref.WeakValueDictionary()
        )
        self._compiling: dict[tuple[Any, ...], threading.Lock] = {}
        self._extensions: set[str] = set()

    def _read(self, config: mc.ModelConfig, model_path: Path) -> Any:
        self._load_extension(config)
        try:
            return self._core.read_model(str(model_path))
        except Exception as exc:
            raise _ov_error(config, f"OpenVINO cannot read '{model_path.name}'", exc) from None

    def _load_extension(self, config: mc.ModelConfig) -> None:
        path = parameter(config, "CPU_EXTENSION_PATH")
        if not path:
            return
        with self._lock:
            if path in self._extensions:
                return
            try:
                self._core.add_extension(path)
            except Exception as exc:
                raise _ov_error(config, "loading custom CPU extensions", exc) from None
            self._extensions.add(path)
            log.info("CPU extensions is loaded %s", path)

    # ---- config checks ------------------------------------------------------------------------

    def complete_config(self, config: mc.ModelConfig, model_path: Path, autocomplete: bool) -> None:
        model = self._read(config, model_path)
        if autocomplete:
            self._autocomplete(config, model)
        self._device_properties(config, 1, 1)  # parameter values are checked at config time
        self._prepare(config, model)

    def _autocomplete(self, config: mc.ModelConfig, model: Any) -> None:
        ports = list(model.inputs) + list(model.outputs)
        batching = bool(ports) and all(
            ov.layout_helpers.has_batch(ov.layout_helpers.get_layout(p)) for p in ports
        )
        if batching:
            # Triton fills max_batch_size whenever it is 0; here only when the config lists no
            # tensors, so that an explicit unbatched config (max_batch_size: 0) is kept.
            if config.max_batch_size == 0 and not config.input and not config.output:
                config.max_batch_size = DEFAULT_MAX_BATCH_SIZE
                log.warning(
                    "autofilled max_batch_size to %d for model '%s' since batching is supported "
                    "but no max_batch_size is specified in model configuration. Must specify "
                    "max_batch_size to utilize autofill with a larger max batch size",
                    DEFAULT_MAX_BATCH_SIZE,
                    config.name,
                )
            if (
                config.max_batch_size > 1
                and not config.HasField("dynamic_batching")
                and not config.HasField("sequence_batching")
            ):
                config.dynamic_batching.SetInParent()
        elif config.max_batch_size != 0:
            log.warning(
                "model layout for model %s does not support batching while non-zero "
                "max_batch_size is specified",
                config.name,
            )
        skip = 1 if config.max_batch_size > 0 else 0
        for kind, model_ports, tensors in (
            ("input", model.inputs, config.input),
            ("output", model.outputs, config.output),
        ):
            if len(tensors):
                log.debug(
                    "skipping %s model configuration auto-complete for '%s': %s already specified",
                    kind,
                    config.name,
                    kind,
                )
                continue
            for port in model_ports:
                added = tensors.add()
                added.name = port.get_any_name()
                added.data_type = mc.DataType.Value(_config_type(port.get_element_type()))
                added.dims.extend(_dims(port.get_partial_shape())[skip:] or [1])

    def _prepare(self, config: mc.ModelConfig, model: Any) -> Any:
        """Check the config against the model; return the model with the config's datatypes and
        (dynamic) batch dimension applied."""
        name = config.name
        inputs = list(model.inputs)
        if len(inputs) != len(config.input):
            raise invalid_arg(
                f"unable to load model '{name}', configuration expects {len(config.input)} "
                f"inputs, model provides {len(inputs)}"
            )
        batched = config.max_batch_size > 0
        new_shapes: dict[str, ov.PartialShape] = {}
        for tensor in config.input:
            index = _find(inputs, tensor.name)
            if index is None:
                allowed = ", ".join(f"'{p.get_any_name()}'" for p in inputs)
                raise invalid_arg(
                    f"unable to load model '{name}', unexpected inference input "
                    f"'{tensor.name}', allowed inputs are: {allowed}"
                )
            shape = inputs[index].get_partial_shape()
            if _yes(config, "RESHAPE_IO_LAYERS"):
                dims = ([-1] if batched else []) + config_dims(tensor)
                new_shapes[tensor.name] = ov.PartialShape(
                    [ov.Dimension() if d == -1 else ov.Dimension(d) for d in dims]
                )
            elif batched and shape.rank.is_static and len(shape) > 0 and shape[0].is_static:
                dims = list(shape)
                dims[0] = ov.Dimension()
                new_shapes[tensor.name] = ov.PartialShape(dims)
        if new_shapes:
            try:
                model.reshape(new_shapes)
            except Exception as exc:
                raise _ov_error(
                    config, "reshaping inputs " + ", ".join(f"'{n}'" for n in new_shapes), exc
                ) from None
        inputs = list(model.inputs)
        outputs = list(model.outputs)
        ppp = preprocess.PrePostProcessor(model)
        for kind, ports, tensors in (
            ("input", inputs, config.input),
            ("output", outputs, config.output),
        ):
            for tensor in tensors:
                index = _find(ports, tensor.name)
                if index is None:
                    allowed = ", ".join(f"'{p.get_any_name()}'" for p in ports)
                    raise invalid_arg(
                        f"unable to load model '{name}', unexpected inference {kind} "
                        f"'{tensor.name}', allowed {kind}s are: {allowed}"
                    )
                type_name = mc.DataType.Name(tensor.data_type)
                element = CONFIG_TO_OV.get(type_name)
                if element is None:
                    raise invalid_arg(
                        f"unsupported datatype {type_name} for {kind} '{tensor.name}' for model "
                        f"'{name}'"
                    )
                port = ports[index]
                if port.get_partial_shape().rank.is_static:  # a dynamic rank takes any shape
                    check_dims(config, kind, tensor, _dims(port.get_partial_shape()))
                if str(port.get_element_type()) != str(element):
                    log.info(
                        "model '%s': %s '%s' is %s in the model, %s in the configuration: "
                        "OpenVINO converts it",
                        name,
                        kind,
                        tensor.name,
                        _config_type(port.get_element_type()),
                        type_name,
                    )
                    try:
                        side = ppp.input(index) if kind == "input" else ppp.output(index)
                        side.tensor().set_element_type(element)
                    except Exception as exc:
                        raise _ov_error(
                            config, f"setting precision for {tensor.name}", exc
                        ) from None
        try:
            return ppp.build()
        except Exception as exc:
            raise _ov_error(config, "applying the configuration's datatypes", exc) from None

    def _device_properties(
        self, config: mc.ModelConfig, instances: int, threads: int, device: str = "CPU"
    ) -> dict[str, Any]:
        """Compile properties from Triton's parameters (checked with Triton's error texts); on
        the CPU, one stream per instance and the instances' share of the cores by default."""
        properties: dict[str, Any] = {}

        def number(key: str) -> int | None:
            value = parameter(config, key)
            if value is None or value == "":
                return None
            if not is_number(value.strip()):
                raise invalid_arg(
                    f"unable to load model '{config.name}': expected the parameter '{key}' to "
                    f"be a non-negative number, got {value.lower()}"
                )
            return int(value)

        inference_threads = number("INFERENCE_NUM_THREADS")
        compilation_threads = number("COMPILATION_NUM_THREADS")
        hint = parameter(config, "PERFORMANCE_HINT")
        streams = parameter(config, "NUM_STREAMS")
        bf16 = parameter(config, "HINT_BF16")
        if bf16:
            if bf16.strip().lower() != "yes":
                raise invalid_arg(
                    f"unable to load model '{config.name}': expected the parameter 'HINT_BF16' "
                    f"to be YES, got {bf16.lower()}"
                )
            properties["INFERENCE_PRECISION_HINT"] = "bf16"
        else:
            # HINT_BF16 is the opt-in: without it, full precision even where OpenVINO would
            # pick bf16 on its own (CPUs with AVX512_BF16/AMX), so answers match the model's.
            properties["INFERENCE_PRECISION_HINT"] = "f32"
        if hint:
            mode = hint.strip().upper()
            if mode not in ("LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT"):
                raise invalid_arg(
                    f"unable to load model '{config.name}': expected the parameter "
                    f"'PERFORMANCE_HINT' to be LATENCY/THROUGHPUT/CUMULATIVE_THROUGHPUT, got "
                    f"{hint.lower()}"
                )
            properties["PERFORMANCE_HINT"] = mode
        if streams:
            value = streams.strip().upper()
            if value not in ("AUTO", "NUMA") and not is_number(value):
                raise invalid_arg(
                    f"unable to load model '{config.name}': expected the parameter "
                    f"'NUM_STREAMS' to be either AUTO/NUMA/<int_value>, got {streams.lower()}"
                )
            properties["NUM_STREAMS"] = int(value) if is_number(value) else value
        elif not hint and device == "CPU":
            # One stream per instance: each instance's infer request runs on its own stream.
            properties["NUM_STREAMS"] = instances
        if inference_threads is not None:
            properties["INFERENCE_NUM_THREADS"] = inference_threads
        elif device == "CPU":
            properties["INFERENCE_NUM_THREADS"] = threads
        if compilation_threads is not None:
            properties["COMPILATION_NUM_THREADS"] = compilation_threads
        pinning = parameter(config, "ENABLE_CPU_PINNING")
        if pinning:
            value = pinning.strip().upper()
            if value not in ("YES", "NO"):
                raise invalid_arg(
                    f"unable to load model '{config.name}': expected the parameter "
                    f"'ENABLE_CPU_PINNING' to be YES or NO, got {pinning.lower()}"
                )
            properties["ENABLE_CPU_PINNING"] = value == "YES"
        elif device == "CPU":
            # OpenVINO pins its threads to cores by default; beside the event loop and other
            # models' threads a pinned thread waits for its busy core instead of moving
            # (ResNet-50 batch 4 on the shared, loaded 2-core dev machine, two runs: median
            # 0.72 s unpinned vs 1.6 s pinned, then 0.62 s vs 0.67 s).
            properties["ENABLE_CPU_PINNING"] = False
        return properties

    # ---- instances ----------------------------------------------------------------------------

    def load(self, context: LoadContext) -> BatchInstance:
        config, model_path, spec = context.config, context.files.model_path, context.spec
        device = (parameter(config, "TARGET_DEVICE") or "CPU").strip().upper()
        instances = total_instances(config)
        properties = self._device_properties(
            config, instances, max(1, spec.cpu_threads) * instances, device
        )
        stat = model_path.stat()
        key = (
            config.name,
            str(model_path),
            stat.st_mtime_ns,
            stat.st_size,
            config.SerializeToString(deterministic=True),
            device,
        )
        with self._lock:  # instances of one version compile once; other models in parallel
            compiling = self._compiling.setdefault(key, threading.Lock())
        with compiling:
            shared = self._compiled.get(key)
            if shared is None:
                shared = self._compile(config, model_path, device, properties)
                self._compiled[key] = shared
            return OpenVinoInstance(config, shared)

    def _compile(
        self, config: mc.ModelConfig, model_path: Path, device: str, properties: dict[str, Any]
    ) -> _Compiled:
        model = self._prepare(config, self._read(config, model_path))
        try:
            compiled = self._core.compile_model(model, device, properties)
        except Exception as exc:
            raise _ov_error(config, f"compiling the model for {device}", exc) from None
        log.info(
            "model '%s': compiled for %s with %s",
            config.name,
            device,
            ", ".join(f"{k}={v}" for k, v in properties.items()),
        )
        return _Compiled(compiled)


class OpenVinoInstance(BatchInstance):
    def __init__(self, config: mc.ModelConfig, shared: _Compiled) -> None:
        self._shared: _Compiled | None = shared  # keeps the compiled model alive
        compiled = shared.compiled
        self._request = compiled.create_infer_request()
        self._outputs: list[tuple[str, int]] = []
        for tensor in config.output:
            index = _find(list(compiled.outputs), tensor.name)
            assert index is not None  # checked by _prepare
            self._outputs.append((tensor.name, index))
        self._bf16_inputs = {t.name for t in config.input if t.data_type == mc.TYPE_BF16}
        self._bf16_outputs = {t.name for t in config.output if t.data_type == mc.TYPE_BF16}

    def execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feed: dict[str, Any] = {}
        for name, array in inputs.items():
            if name in self._bf16_inputs:
                tensor = ov.Tensor(ov.Type.bf16, ov.Shape(list(array.shape)))
                np.copyto(tensor.data.view(np.uint16), np.asarray(array).view(np.uint16))
                feed[name] = tensor
            else:
                feed[name] = array
        results = self._request.infer(feed, share_inputs=True, share_outputs=False)
        values = results.to_tuple()
        outputs: dict[str, np.ndarray] = {}
        for name, index in self._outputs:
            if name in self._bf16_outputs:
                data = self._request.get_output_tensor(index).data
                outputs[name] = np.array(data.view(np.uint16)).view(_BF16)
            else:
                outputs[name] = values[index]
        return outputs

    def close(self) -> None:
        self._request = None
        self._shared = None
