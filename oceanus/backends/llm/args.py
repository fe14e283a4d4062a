"""`model.json`, the engine arguments of Triton's vLLM backend, read for the CPU engine.

vLLM's own keys keep their meaning; keys that only steer GPUs (memory fraction, parallelism,
CUDA graphs) are accepted and logged as ignored, so a folder written for Triton loads unchanged."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oceanus.backends.llm import gguf_model, lora_config
from oceanus.backends.llm.engine_choice import ENGINES, choose_engine
from oceanus.core.errors import invalid_arg, unavailable

log = logging.getLogger("oceanus.backends.llm")

MODEL_JSON = "model.json"

# vLLM engine arguments that mean nothing to a CPU engine.
GPU_ONLY = frozenset(
    {
        "gpu_memory_utilization",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "enforce_eager",
        "swap_space",
        "cpu_offload_gb",
        "max_seq_len_to_capture",
        "disable_custom_all_reduce",
        "distributed_executor_backend",
        "num_gpu_blocks_override",
        "enable_chunked_prefill",
        "disable_log_stats",
        "disable_log_requests",
        "worker_use_ray",
        "engine_use_ray",
    }
)


@dataclass(frozen=True)
class EngineArgs:
    model: Path  # the Hugging Face folder
    tokenizer: Path
    dtype: str = "float32"
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    max_num_seqs: int = 32  # sequences decoded together (the running batch)
    seed: int = 0
    trust_remote_code: bool = False
    # Tokens prefilled per engine step, over all prompts being prefilled (chunked prefill).
    max_num_batched_tokens: int = 512
    # KV-cache token budget: admitted requests reserve prompt + max_tokens; beyond it, wait.
    kv_cache_tokens: int | None = None  # None: max_num_seqs * max_model_len
    # Threads torch may use for this engine (None: the instance's share of the cores).
    num_threads: int | None = None
    # The KV cache's element type: "auto" (vLLM's default) keeps it in the model's dtype.
    kv_cache_dtype: str = "auto"
    # Oceanus's own key: "transformers" (engine.py) or "openvino" (OpenVINO GenAI's
    # continuous-batching pipeline in a process of its own: openvino_engine.py); model.json's
    # "auto" (its default) is resolved to one of them when read (engine_choice.py).
    engine: str = "transformers"
    # vLLM's engine argument: the name routers and dashboards see (the metrics' `model_name`
    # label); None: the model's name in the repository.
    served_model_name: str | None = None
    # vLLM's CacheConfig name: the KV cache's memory budget in bytes (None: the environment's
    # VLLM_CPU_KVCACHE_SPACE in GiB, as vLLM's CPU build reads it, else memory.py's default).
    kv_cache_memory_bytes: int | None = None
    # vLLM's name: tokens per KV-cache block, the step in which a sequence's cells grow.
    block_size: int = 16
    # vLLM's key (on by default, as in vLLM): full blocks of a finished sequence's KV are kept
    # and reused by a later prompt that starts with the same tokens (kv_cache.py).
    enable_prefix_caching: bool = True
    # vLLM's key: "int8" keeps the linears' weights int8 (weight-only, per output channel:
    # quant.py; NNCF's compression on the openvino engine), "int4" (openvino engine: symmetric,
    # in groups of up to 128 inputs); None keeps them in `dtype`.
    quantization: str | None = None
    # vLLM's `runner`: "generate" / "auto" (what the model's architecture says), or "pooling":
    # a generating model served as an embedding model (embedder.py: the last token's hidden
    # state, normalized, as vLLM pools a decoder). vLLM's older `task: "embed"` means "pooling".
    runner: str = "auto"
    # vLLM's LoRA keys (lora.py): adapters served beside the base model; at most `max_loras`
    # adapters in one step, each of rank <= `max_lora_rank`.
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    # The adapters loaded at start, (name, folder): vLLM's `lora_modules` and Triton's
    # `multi_lora.json` beside model.json (lora_config.py).
    lora_modules: tuple[tuple[str, Path], ...] = ()
    # How `dtype` was chosen ("model.json", or why "auto" gave it); not a model.json key.
    dtype_source: str = "default"
    # How `engine` was chosen ("model.json", or why "auto" gave it); not a model.json key.
    engine_source: str = "default"


# vLLM engine arguments read but not acted on: the model's own default sampling parameters
# (`generation_config`, "auto" in vLLM) are not applied yet; a request's own, else vLLM's
# defaults, are used.
NOT_APPLIED = frozenset({"generation_config"})


# Not model.json keys.
_INTERNAL = frozenset({"dtype_source", "engine_source"})
_ALSO_READ = frozenset({"task"})  # vLLM's older name of `runner`

# CPU flags with fast bfloat16 dot products (oneDNN's bf16 matmuls): AVX512-BF16, AMX.
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none: not Linux)."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def auto_dtype(flags: frozenset[str] | set[str]) -> tuple[str, str]:
    """dtype "auto" as vLLM's CPU build resolves it: bfloat16 where the CPU computes bf16 dot
    products natively (AVX512-BF16 or AMX), float32 elsewhere; and why, for the load log."""
    found = [flag for flag in BF16_FLAGS if flag in flags]
    if found:
        return "bfloat16", f"auto: this CPU has {'/'.join(found)}"
    return "float32", "auto: this CPU has no avx512_bf16/amx_bf16"


def _resolve(name: str, version_dir: Path, files: bool = False) -> Path:
    """A local folder (absolute or relative to the version folder), or where `files`, a `.gguf`
    file; else a model name found in the local Hugging Face cache (nothing is downloaded)."""
    path = Path(name).expanduser()
    for candidate in (path, version_dir / path):
        if candidate.is_dir() or (files and gguf_model.is_gguf(candidate)):
            return candidate
    if files and path.suffix.lower() == gguf_model.SUFFIX:
        raise unavailable(
            f"model '{name}' in {MODEL_JSON}: no such GGUF file (absolute, or relative to "
            f"the version folder {version_dir})"
        )
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception:
        raise unavailable(
            f"model '{name}' in {MODEL_JSON} is neither a local folder nor in the local Hugging "
            "Face cache (Oceanus downloads nothing at load: fetch it first, e.g. "
            f"`huggingface-cli download {name}`)"
        ) from None


def _int(raw: dict[str, Any], key: str, default: int | None) -> int | None:
    value = raw.get(key, default)
    if value is None:
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise invalid_arg(f"{MODEL_JSON}: '{key}' must be an integer, got {value!r}") from None
    if number < 1:
        raise invalid_arg(f"{MODEL_JSON}: '{key}' must be at least 1, got {value!r}")
    return number


# vLLM's `kv_cache_dtype` values: "auto" is the model's dtype; its fp8 formats have no fast
# kernel on CPU here and are refused rather than faked. Ours: a 16-bit or 32-bit cache under a
# model of another dtype (e.g. float32 compute over a bfloat16 cache: half the bytes a decode
# step reads; each sequence's keys are widened to the model's dtype as attention reads them).
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16")


def _kv_cache_dtype(raw: dict[str, Any], path: Path) -> str:
    value = str(raw.get("kv_cache_dtype", "auto"))
    if value not in KV_CACHE_DTYPES:
        raise invalid_arg(
            f"{path}: 'kv_cache_dtype' {value!r} is not supported by the CPU engine: use "
            f"{', '.join(KV_CACHE_DTYPES)} (fp8 KV caches need vLLM's GPU kernels)"
        )
    return value


# `quantization`, weight-only, per engine: int8 on both (quant.py; NNCF's weight compression for
# OpenVINO), int4 on the openvino engine only (torch's CPU int4 matmul was far slower than float).
QUANTIZATIONS = {"transformers": ("int8",), "openvino": ("int8", "int4")}


def _quantization(raw: dict[str, Any], path: Path, engine: str) -> str | None:
    """vLLM's `quantization` key: weight-only "int8" or "int4" where the engine runs it; vLLM's
    GPU methods are refused. (Not imported from quant.py: reading model.json needs no torch.)"""
    value = raw.get("quantization")
    if value is None or value == "" or str(value).lower() == "none":
        return None
    if str(value) not in QUANTIZATIONS[engine]:
        everywhere = sorted({q for values in QUANTIZATIONS.values() for q in values})
        hint = f'the "{engine}" engine runs {", ".join(repr(q) for q in QUANTIZATIONS[engine])}' + (
            "; 'int4' runs on engine \"openvino\"" if str(value) == "int4" else ""
        )
        raise invalid_arg(
            f"{path}: 'quantization' {value!r} is not supported here: {hint} (weight-only "
            f"{'/'.join(everywhere)}); leave it out for the model's own precision (vLLM's GPU "
            "methods such as awq, gptq, fp8, bitsandbytes need its CUDA kernels)"
        )
    return str(value)


def _engine(raw: dict[str, Any], path: Path) -> str:
    value = str(raw.get("engine", "auto"))
    if value not in ENGINES:
        raise invalid_arg(f"{path}: 'engine' must be one of {', '.join(ENGINES)}, got {value!r}")
    return value


def read_engine_args(version_dir: Path, model_name: str) -> EngineArgs:
    path = version_dir / MODEL_JSON
    if not path.is_file():
        raise unavailable(
            f"'{MODEL_JSON}' containing vllm engine args must be provided in '{version_dir}'"
        )
    try:
        raw = json.loads(path.read_text())
    except ValueError as exc:
        raise invalid_arg(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("model"), str):
        raise invalid_arg(f"{path}: a JSON object with a 'model' string is required")
    known = ({f for f in EngineArgs.__dataclass_fields__} - _INTERNAL) | _ALSO_READ
    for key in sorted(raw):
        if key in NOT_APPLIED:
            log.info("model '%s': %s key '%s' is not applied yet", model_name, MODEL_JSON, key)
        elif key in GPU_ONLY:
            log.info("model '%s': %s key '%s' ignored (GPU-only)", model_name, MODEL_JSON, key)
        elif key not in known:
            log.warning("model '%s': %s key '%s' ignored (unknown)", model_name, MODEL_JSON, key)
    model = _resolve(raw["model"], version_dir, files=True)
    if raw.get("tokenizer"):
        tokenizer = _resolve(raw["tokenizer"], version_dir)
    elif gguf_model.is_gguf(model):
        # The tokenizer is read from the file and saved to this folder at load (gguf_model.py).
        tokenizer = gguf_model.tokenizer_dir(model)
    else:
        tokenizer = model
    dtype = str(raw.get("dtype", "auto"))
    source = "model.json"
    if dtype == "auto":
        dtype, source = auto_dtype(cpu_flags())
    elif dtype == "float":  # vLLM's alias
        dtype = "float32"
    elif dtype in ("half", "float16"):
        # CPUs have no fast float16 matmul: float16 runs float32 (bfloat16 if asked).
        source = f"model.json {dtype!r} runs float32 on CPU"
        dtype = "float32"
    if dtype not in ("float32", "bfloat16"):
        raise invalid_arg(f"{path}: dtype must be auto, float32 or bfloat16, got {dtype!r}")
    remote = raw.get("trust_remote_code", False)
    modules = lora_config.lora_modules(raw, version_dir, path)
    enable_lora = bool(modules) or str(raw.get("enable_lora", False)).lower() == "true"
    runner = _runner(raw, path)
    engine, engine_source = choose_engine(
        _engine(raw, path),
        model,
        runner=runner,
        enable_lora=enable_lora,
        quantized=raw.get("quantization") not in (None, "", "none", "None"),
    )
    if enable_lora and engine != "transformers":
        raise invalid_arg(f'{path}: LoRA adapters run on the "transformers" engine only')
    quantization = _quantization(raw, path, engine)
    return EngineArgs(
        model=model,
        tokenizer=tokenizer,
        dtype=dtype,
        max_model_len=_int(raw, "max_model_len", None),
        max_num_seqs=_int(raw, "max_num_seqs", 32) or 32,
        seed=int(raw.get("seed", 0) or 0),
        trust_remote_code=remote is True or str(remote).lower() == "true",
        max_num_batched_tokens=_int(raw, "max_num_batched_tokens", 512) or 512,
        kv_cache_tokens=_int(raw, "kv_cache_tokens", None),
        num_threads=_int(raw, "num_threads", None),
        kv_cache_dtype=_kv_cache_dtype(raw, path),
        engine=engine,
        served_model_name=str(raw["served_model_name"]) if raw.get("served_model_name") else None,
        kv_cache_memory_bytes=_int(raw, "kv_cache_memory_bytes", None),
        block_size=_int(raw, "block_size", 16) or 16,
        enable_prefix_caching=str(raw.get("enable_prefix_caching", True)).lower() != "false",
        quantization=quantization,
        runner=runner,
        enable_lora=enable_lora,
        max_loras=_int(raw, "max_loras", 1) or 1,
        max_lora_rank=_int(raw, "max_lora_rank", 16) or 16,
        lora_modules=modules,
        dtype_source=source,
        engine_source=engine_source,
    )


def _runner(raw: dict[str, Any], path: Path) -> str:
    """vLLM's `runner` (auto, generate, pooling), or its older `task` (embed: pooling)."""
    runner = str(raw.get("runner", "auto"))
    if runner not in ("auto", "generate", "pooling"):
        raise invalid_arg(f"{path}: runner must be auto, generate or pooling, got {runner!r}")
    task = str(raw.get("task", "auto"))
    if task not in ("auto", "generate", "embed", "embedding"):
        raise invalid_arg(f"{path}: task must be auto, generate or embed, got {task!r}")
    if task in ("embed", "embedding"):
        if runner == "generate":
            raise invalid_arg(f"{path}: task {task!r} needs runner 'pooling', not 'generate'")
        return "pooling"
    return runner if task == "auto" else "generate"
