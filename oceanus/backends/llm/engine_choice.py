"""model.json's `engine`: "transformers", "openvino", or "auto" (the default), which picks the
faster engine the model and the request features allow.

Why "auto" prefers OpenVINO (docs/serving-your-llm.md, "Two engines"; bench/results/): on the
same weights and machine, the openvino engine made 1.7-2.2x the transformers engine's output
tokens/s at 1, 8 and 32 concurrent streams, and it keeps a GGUF file's quantized weights
quantized. What stays on the transformers engine: architectures the exporter does not trace,
models served for pooling or scoring, LoRA adapters, installs without openvino-genai, and
models whose first openvino load (a float32 trace) would not fit the memory available.
Requests asking what only the transformers engine does (logit_bias, top-N or prompt logprobs,
Lark grammars) are refused per request, naming the key that switches engines."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from oceanus.backends.llm import gguf_model

ENGINES = ("auto", "transformers", "openvino")
# What openvino_export.py traces (kept here so that reading model.json needs no OpenVINO).
OPENVINO_ARCHITECTURES = ("llama", "mistral", "qwen2")
# The first load traces the model in float32 (openvino_export.py), unless a traced copy is
# cached: measured, the tracing process peaked at 2.0x the model's float32 bytes (the 135M-shaped
# generator model: 1.25 GB for 622 MB), and the compiled pipeline comes on top in the same
# process. "auto" keeps models whose trace would not fit the memory at hand on the transformers
# engine, which loads the weights in their dtype.
TRACE_PEAK_PER_FP32_BYTE = 2.5
GENAI_EXTRA = "pip install 'oceanus[llm]'"
NNCF_EXTRA = "pip install 'oceanus[llm-openvino]'"


def _model_config(model: Path) -> dict[str, object]:
    """config.json of a Hugging Face folder, a GGUF file's metadata as one; {} if unreadable."""
    try:
        if gguf_model.is_gguf(model):
            return dict(gguf_model.config_of(model).to_dict())
        loaded = json.loads((model / "config.json").read_text())
        return loaded if isinstance(loaded, dict) else {}
    except (OSError, ValueError):
        return {}


def _quantized_gguf(model: Path) -> bool:
    return gguf_model.is_gguf(model) and gguf_model.kept_quantization(model) is not None


def installed(module: str) -> bool:
    """Whether `module` imports, without importing it (OpenVINO costs the server ~0.5 s)."""
    if module in sys.modules:
        return sys.modules[module] is not None
    return importlib.util.find_spec(module) is not None


def choose_engine(
    requested: str, model: Path, *, runner: str, enable_lora: bool, quantized: bool
) -> tuple[str, str]:
    """The engine for model.json's `engine` value, and why (for the load log)."""
    if requested != "auto":
        return requested, "model.json"
    if runner == "pooling":
        return "transformers", "auto: served for pooling"
    if enable_lora:
        return "transformers", "auto: LoRA adapters run on the transformers engine"
    config = _model_config(model)
    kind = config.get("model_type")
    architectures = config.get("architectures")
    names = architectures if isinstance(architectures, list) else []
    causal = any(str(a).endswith("ForCausalLM") for a in names)
    if kind not in OPENVINO_ARCHITECTURES or not (causal or gguf_model.is_gguf(model)):
        return "transformers", f"auto: the openvino engine does not trace model_type {kind!r}"
    if not installed("openvino_genai"):
        return "transformers", f"auto: openvino-genai is not installed ({GENAI_EXTRA})"
    # Quantized weights (model.json's `quantization`, a quantized GGUF's) need NNCF there.
    if (quantized or _quantized_gguf(model)) and not installed("nncf"):
        return "transformers", f"auto: NNCF is not installed ({NNCF_EXTRA})"
    short = _trace_short_of_memory(model, config)
    if short:
        return "transformers", f'auto: {short}; "engine": "openvino" traces it anyway'
    return "openvino", f"auto: a {kind} causal LM and openvino-genai installed"


def parameter_count(config: dict[str, object]) -> int:
    """A Llama-family decoder's parameters, from its config (norms left out: a rounding)."""

    def get(key: str, default: int = 0) -> int:
        value = config.get(key)
        return int(value) if isinstance(value, (int, float, str)) else default

    hidden, heads = get("hidden_size"), max(1, get("num_attention_heads", 1))
    head_dim = get("head_dim") or hidden // heads
    kv_heads = get("num_key_value_heads") or heads
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    layer = attention + 3 * hidden * get("intermediate_size")
    tables = 1 if config.get("tie_word_embeddings") else 2
    return get("num_hidden_layers") * layer + tables * get("vocab_size") * hidden


def _trace_short_of_memory(model: Path, config: dict[str, object]) -> str:
    """Why the first load's trace would not fit the memory available ("" when it fits, or
    when the model's traced copy is cached and nothing is traced)."""
    from oceanus.backends.llm.memory import available_bytes, human
    from oceanus.backends.llm.openvino_export import is_cached

    available = available_bytes()
    if available is None or is_cached(model):
        return ""
    need = int(parameter_count(config) * 4 * TRACE_PEAK_PER_FP32_BYTE)
    if need <= available:
        return ""
    return (
        f"tracing it for the openvino engine (its first load) needs about {human(need)}, "
        f"{human(available)} is available"
    )
