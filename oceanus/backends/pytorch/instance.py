"""One PyTorch model instance: its execution thread's settings and the tensor conversions."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.backends._common import bool_parameter, optional_bool_parameter
from oceanus.backends.pytorch.common import BF16, TORCH_TYPES, Signature, dtype_name
from oceanus.core.backend import BatchInstance
from oceanus.core.errors import invalid_arg


class PyTorchInstance(BatchInstance):
    def __init__(
        self,
        config: mc.ModelConfig,
        module: Any,
        signature: Signature,
        device: torch.device,
        threads: int,
    ) -> None:
        self._name = config.name
        self._module = module
        # TorchScript modules are called through forward(); .pt2 programs are callables.
        self._call: Callable[..., Any] | None = (
            module.forward if isinstance(module, torch.jit.ScriptModule) else module
        )
        self._sig = signature
        self._device = device
        self._threads = threads
        self._thread_id: int | None = None
        self._inference_mode = bool_parameter(config, "INFERENCE_MODE", True)
        self._optimize = not bool_parameter(config, "DISABLE_OPTIMIZED_EXECUTION", False)
        self._jit_executor = optional_bool_parameter(config, "ENABLE_JIT_EXECUTOR")
        self._jit_profiling = optional_bool_parameter(config, "ENABLE_JIT_PROFILING")
        self._tensor_fuser = optional_bool_parameter(config, "ENABLE_TENSOR_FUSER")
        self._clean_cache = device.type == "cuda" and bool_parameter(
            config, "ENABLE_CACHE_CLEANING", False
        )
        self._input_types = {
            t.name: TORCH_TYPES.get(mc.DataType.Name(t.data_type)) for t in config.input
        }
        self._outputs = [(t.name, mc.DataType.Name(t.data_type)) for t in config.output]
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def _configure_thread(self) -> None:
        """Per-thread settings, made once on the instance's own execution thread."""
        self._thread_id = threading.get_ident()
        if self._device.type == "cpu":
            # ATen sizes a thread's OpenMP team from the process-wide value the first time the
            # thread runs an operator: do that first, or another instance's later
            # set_num_threads() would become this thread's size.
            torch.get_num_threads()
            torch.set_num_threads(self._threads)
        torch._C._set_graph_executor_optimize(self._optimize)

    def _global_switches(self) -> None:
        """Process-wide JIT switches, applied before each run only when the config sets them."""
        if self._jit_executor is not None:
            torch._C._jit_set_profiling_executor(self._jit_executor)
        if self._jit_profiling is not None and hasattr(torch._C, "_jit_set_profiling_mode"):
            torch._C._jit_set_profiling_mode(self._jit_profiling)
        if self._tensor_fuser is not None:
            torch._C._jit_set_texpr_fuser_enabled(self._tensor_fuser)

    def execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._thread_id != threading.get_ident():
            self._configure_thread()
        self._global_switches()
        if self._stream is not None:
            with torch.cuda.stream(self._stream):
                outputs = self._run(inputs)
            if self._clean_cache:
                torch.cuda.empty_cache()
            return outputs
        return self._run(inputs)

    def _run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        guard = torch.inference_mode() if self._inference_mode else torch.no_grad()
        with guard:
            if self._sig.dict_input:
                assert self._call is not None
                result = self._call(
                    {name: self._to_tensor(name, array) for name, array in inputs.items()}
                )
            else:
                arguments: list[Any] = [None] * self._sig.input_count
                for name, array in inputs.items():
                    arguments[self._sig.input_index[name]] = self._to_tensor(name, array)
                assert self._call is not None
                result = self._call(*arguments)
            return self._read_outputs(result)

    def _to_tensor(self, name: str, array: np.ndarray) -> Any:
        if array.dtype == np.dtype(object):
            try:
                return [b.decode() if isinstance(b, bytes) else str(b) for b in array.reshape(-1)]
            except UnicodeDecodeError:
                raise invalid_arg(
                    f"input '{name}' holds bytes that are not valid UTF-8, which TorchScript "
                    "List[str] arguments cannot carry"
                ) from None
        if not array.flags.writeable or not array.flags.c_contiguous:
            # Request bodies are read-only views; the model may write into its inputs.
            array = np.array(array, order="C")
        if array.dtype == BF16:
            tensor = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        else:
            tensor = torch.from_numpy(array)
        if self._device.type != "cpu":
            tensor = tensor.to(self._device, non_blocking=True)
        return tensor

    def _read_outputs(self, result: Any) -> dict[str, np.ndarray]:
        if self._sig.dict_output:
            if not isinstance(result, dict):
                raise invalid_arg(f"output of model '{self._name}' must be a Dict[str, Tensor]")
            values: Any = result
        elif isinstance(result, torch.Tensor) or (
            isinstance(result, list) and (not result or isinstance(result[0], str))
        ):
            values = [result]
        elif isinstance(result, tuple | list):
            values = list(result)
        else:
            raise invalid_arg(
                "output must be of type Tensor, List[str] or Tuple containing one of these two "
                f"types, got {type(result).__name__}"
            )
        outputs: dict[str, np.ndarray] = {}
        for name, config_type in self._outputs:
            if self._sig.dict_output:
                if name not in values:
                    raise invalid_arg(f"output tensor '{name}' is not found")
                value = values[name]
            else:
                index = self._sig.output_index[name]
                if index >= len(values):
                    raise invalid_arg(
                        f"The output {name} in the model configuration refers to an output "
                        f"index which doesn't exist. This model has {len(values)} outputs"
                    )
                value = values[index]
            outputs[name] = self._to_numpy(name, config_type, value)
        return outputs

    def _to_numpy(self, name: str, config_type: str, value: Any) -> np.ndarray:
        if isinstance(value, list) and config_type == "TYPE_STRING":
            return np.array(
                [s.encode() if isinstance(s, str) else bytes(s) for s in value], dtype=object
            )
        if not isinstance(value, torch.Tensor):
            raise invalid_arg(
                f"output '{name}' must be of type Tensor or List[str], got {type(value).__name__}"
            )
        model_type = dtype_name(value.dtype)
        if model_type != config_type:
            raise invalid_arg(
                f"configuration expects datatype {config_type} for output '{name}', model "
                f"provides {model_type}"
            )
        if value.dim() == 0:
            raise invalid_arg(f"output '{name}' is a scalar which is not supported.")
        value = value.detach()
        if value.device.type != "cpu":
            value = value.cpu()
        value = value.contiguous()
        if value.dtype == torch.bfloat16:
            bf16: np.ndarray = value.view(torch.int16).numpy().view(BF16)
            return bf16
        array: np.ndarray = value.numpy()
        return array

    def close(self) -> None:
        self._module = None
        self._call = None
