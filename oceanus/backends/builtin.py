"""The built-in backends as registry specs: each framework is imported when a model first needs
it, so unused frameworks cost nothing at start-up."""

from __future__ import annotations

import functools
from collections.abc import Sequence

from oceanus.core.backend import Backend
from oceanus.core.backend_registry import BackendRegistry, BackendSpec


def _onnxruntime() -> Backend:
    from oceanus.backends.onnxruntime import OnnxRuntimeBackend

    return OnnxRuntimeBackend()


def _tensorrt() -> Backend:
    # Imports TensorRT only when a model loads, so that a machine without a GPU is told so.
    from oceanus.backends.tensorrt import TensorRTBackend

    return TensorRTBackend()


def _pytorch() -> Backend:
    from oceanus.backends.pytorch import PyTorchBackend

    return PyTorchBackend()


def _openvino() -> Backend:
    from oceanus.backends.openvino import OpenVinoBackend

    return OpenVinoBackend()


def _llm() -> Backend:
    from oceanus.backends.llm.backend import LlmBackend

    return LlmBackend()


def _python(backend_config: tuple[str, ...]) -> Backend:
    from oceanus.backends.python import options
    from oceanus.backends.python.backend import PythonBackend

    return PythonBackend(options.parse(options.backend_settings(backend_config, "python")))


def specs(backend_config: Sequence[str] = ()) -> list[BackendSpec]:
    """In the order Triton's auto-complete tries model file names; `backend_config` holds the
    --backend-config flags (`backend,key=value`)."""
    return [
        BackendSpec(
            "onnxruntime",
            _onnxruntime,
            model_files={"model.onnx": ""},
            platforms=("onnxruntime_onnx",),
            framework="onnxruntime",
            label="ONNX Runtime",
            install="pip install onnxruntime",
        ),
        BackendSpec(
            "tensorrt",
            _tensorrt,
            model_files={"model.plan": ""},
            platforms=("tensorrt_plan",),
            framework="tensorrt",
            label="TensorRT",
            install="pip install oceanus[tensorrt]",
        ),
        BackendSpec(
            "pytorch",
            _pytorch,
            # A PyTorch model is recognized, but its config must still list every input and
            # output (the backend says so).
            model_files={"model.pt": "", "model.pt2": "torch_aoti"},
            platforms=("pytorch_libtorch", "torch_aoti"),
            framework="torch",
            label="PyTorch",
            install="pip install oceanus[pytorch]",
        ),
        BackendSpec(
            "openvino",
            _openvino,
            model_files={"model.xml": ""},
            framework="openvino",
            label="OpenVINO",
            install="pip install oceanus[openvino]",
        ),
        BackendSpec(
            "python",
            functools.partial(_python, tuple(backend_config)),
            model_files={"model.py": ""},
        ),
        # Triton's vLLM model folders, and the same engine under our own name.
        *(
            BackendSpec(
                name,
                _llm,
                framework="transformers",
                label="the LLM engine (torch and transformers)",
                install="pip install 'oceanus[llm]'",
            )
            for name in ("vllm", "oceanus_llm")
        ),
    ]


def registry(entry_points: bool = True, backend_config: Sequence[str] = ()) -> BackendRegistry:
    """The built-in backends, then those installed packages add (which may replace them)."""
    found = BackendRegistry(specs(backend_config))
    if entry_points:
        found.register_entry_points()
    return found
