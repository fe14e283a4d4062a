"""The PyTorch backend: config checks against the model file, and loading instances."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import torch
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.backends._common import bool_parameter, int_parameter, optional_bool_parameter
from oceanus.backends.pytorch.common import Signature
from oceanus.backends.pytorch.instance import PyTorchInstance
from oceanus.backends.pytorch.pt2 import is_pt2, load_pt2, pt2_signature
from oceanus.backends.pytorch.torchscript import jit_load, torchscript_signature
from oceanus.core.backend import Backend, BatchInstance, LoadContext, model_file
from oceanus.core.errors import invalid_arg

log = logging.getLogger("oceanus.backends.pytorch")

# The inter-op pool (TorchScript's fork/wait) is process-wide and sized once.
_interop_lock = threading.Lock()
_interop_threads: int | None = None


class PyTorchBackend(Backend):
    name = "pytorch"
    default_model_filename = "model.pt"

    def __init__(self) -> None:
        self._signatures: dict[tuple[str, str], Signature] = {}
        self._warned: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def gpu_available(self) -> bool:
        return bool(torch.cuda.is_available())

    def model_path(self, config: mc.ModelConfig, version_dir: Path) -> Path:
        default = "model.pt2" if config.platform == "torch_aoti" else "model.pt"
        return model_file(config, version_dir, default)

    # ---- config checks ------------------------------------------------------------------------

    def complete_config(self, config: mc.ModelConfig, model_path: Path, autocomplete: bool) -> None:
        pt2 = is_pt2(config, model_path)
        for kind, tensors in (("input", config.input), ("output", config.output)):
            if not tensors:
                what = "a PyTorch 2 package" if pt2 else "a TorchScript file does not record"
                raise invalid_arg(
                    f"unable to load model '{config.name}': model configuration must contain at "
                    f"least one {kind}, none were specified ("
                    + (
                        f"{what}: the PyTorch backend does not auto-complete "
                        if pt2
                        else f"{what} its {kind} names, datatypes or shapes, so the PyTorch "
                        "backend cannot auto-complete them: "
                    )
                    + f"list every {kind} in config.pbtxt)"
                )
        for name in (
            "INFERENCE_MODE",
            "DISABLE_OPTIMIZED_EXECUTION",
            "DISABLE_CUDNN",
            "ENABLE_CACHE_CLEANING",
            "ENABLE_JIT_EXECUTOR",
            "ENABLE_JIT_PROFILING",
            "ENABLE_TENSOR_FUSER",
        ):
            optional_bool_parameter(config, name)
        for name in ("INTRA_OP_THREAD_COUNT", "NUM_THREADS"):
            int_parameter(config, name, minimum=1)
        for name in ("INTER_OP_THREAD_COUNT", "NUM_INTEROP_THREADS"):
            int_parameter(config, name, minimum=1)
        if pt2:
            signature = pt2_signature(config, load_pt2(config, model_path, "cpu"))
        else:
            signature = torchscript_signature(config, jit_load(config, model_path, "cpu"))
        with self._lock:
            self._signatures[(config.name, str(model_path))] = signature

    # ---- instances ----------------------------------------------------------------------------

    def load(self, context: LoadContext) -> BatchInstance:
        config, model_path, spec = context.config, context.files.model_path, context.spec
        with self._lock:
            signature = self._signatures.get((config.name, str(model_path)))
        pt2 = is_pt2(config, model_path)
        if signature is None:  # a version other than the one complete_config read
            signature = (
                pt2_signature(config, load_pt2(config, model_path, "cpu"))
                if pt2
                else torchscript_signature(config, jit_load(config, model_path, "cpu"))
            )
        device = "cpu"
        if spec.kind == "GPU":
            if torch.cuda.is_available():
                device = f"cuda:{spec.device_id}"
            else:
                key = (config.name, "gpu")
                if key not in self._warned:
                    self._warned.add(key)
                    log.warning(
                        "model '%s': KIND_GPU instance but this PyTorch (%s) has no CUDA; "
                        "running it on the CPU",
                        config.name,
                        torch.__version__,
                    )
        self._size_interop_pool(config)
        module: Any
        if pt2:
            program = load_pt2(config, model_path, device)
            device = program.device  # a CPU AOTInductor package runs on the CPU
            module = program.call
        else:
            module = jit_load(config, model_path, device)
        if bool_parameter(config, "DISABLE_CUDNN", False):
            torch.backends.cudnn.enabled = False
        intra = int_parameter(config, "INTRA_OP_THREAD_COUNT", 1) or int_parameter(
            config, "NUM_THREADS", 1
        )
        threads = intra or max(1, spec.cpu_threads)
        return PyTorchInstance(config, module, signature, torch.device(device), threads)

    def _size_interop_pool(self, config: mc.ModelConfig) -> None:
        global _interop_threads
        wanted = int_parameter(config, "INTER_OP_THREAD_COUNT", 1) or int_parameter(
            config, "NUM_INTEROP_THREADS", 1
        )
        if wanted is None:
            return
        with _interop_lock:
            if _interop_threads is None:
                try:
                    torch.set_num_interop_threads(wanted)
                    _interop_threads = wanted
                    return
                except RuntimeError as exc:  # already used: its size is fixed for the process
                    _interop_threads = torch.get_num_interop_threads()
                    log.warning("model '%s': INTER_OP_THREAD_COUNT ignored: %s", config.name, exc)
                    return
            if _interop_threads != wanted:
                log.warning(
                    "model '%s': INTER_OP_THREAD_COUNT %d ignored: the process-wide inter-op "
                    "pool already has %d threads (the first model's setting wins, as in Triton)",
                    config.name,
                    wanted,
                    _interop_threads,
                )
