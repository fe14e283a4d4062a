"""`oceanus serve MODEL`'s flags: `vllm serve`'s common ones, with vLLM's names, declared once
here with oceanus/declaration.py's machinery (as settings.py declares tritonserver's), so the
command line and its `--help` are generated from this table.

Flags vLLM has that steer GPUs or features a CPU server has no use for (`--tensor-parallel-size`,
`--gpu-memory-utilization`, `--enforce-eager`, ...) are accepted and logged as ignored
(serve.py), so a launch line written for vLLM starts unchanged.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from oceanus.backends.llm.engine_choice import ENGINES
from oceanus.declaration import COUNT, PORT, choice, setting

# Parsers with vLLM's names (oceanus/frontends/openai/tools.py, reasoning.py).
TOOL_CALL_PARSERS = ("hermes", "llama3_json", "mistral")
REASONING_PARSERS = ("deepseek_r1", "qwen3")
# vLLM's --dtype values ("float" is float32; half/float16 run float32 on CPUs: args.py).
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")

SERVER, MODEL, API, OCEANUS = GROUPS = ("server", "model and engine", "OpenAI API", "Oceanus's own")


def parse_length(text: str) -> int:
    """vLLM's --max-model-len: an integer, or with a k/m suffix (`32k` = 32000, `32K` = 32768)."""
    units = {"k": 1000, "m": 1000**2, "K": 1024, "M": 1024**2}
    number, unit = (text[:-1], units[text[-1]]) if text and text[-1] in units else (text, 1)
    try:
        value = int(float(number) * unit)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid length '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"length must be at least 1, got '{text}'")
    return value


def parse_positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"value must be at least 1, got {value}")
    return value


POSITIVE: dict[str, Any] = {"parse": parse_positive, "kind": int, "metavar": "N"}


def _parser_name(kind: str, names: tuple[str, ...]) -> Callable[[str], str]:
    """One of `names`; another of vLLM's parsers is refused naming the ones served here."""
    pick = choice(*names)

    def parse(text: str) -> str:
        try:
            return pick(text)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"{kind} '{text}' is not available in Oceanus (available: {', '.join(names)})"
            ) from None

    return parse


@dataclass
class ServeSettings:
    # ---- the model (also the first positional argument, as `vllm serve MODEL`)
    model: str = setting(
        "", "--model", "the Hugging Face model folder (or a name in the local HF cache)", MODEL
    )
    served_model_name: list[str] = setting(
        [],
        "--served-model-name",
        "the name(s) clients ask for (default: MODEL as given); the first one labels the metrics",
        MODEL,
        many=True,
        metavar="NAME",
    )
    tokenizer: str | None = setting(None, "--tokenizer", "another folder's tokenizer", MODEL)
    dtype: str = setting(
        "auto",
        "--dtype",
        "weights and matmuls: auto/float/float32 (float32), bfloat16; half/float16 run float32",
        MODEL,
        parse=choice(*DTYPES),
        metavar="|".join(DTYPES),
    )
    max_model_len: int | None = setting(
        None,
        "--max-model-len",
        "the longest sequence, prompt and output (default: the model's max_position_embeddings)",
        MODEL,
        kind=int,
        parse=parse_length,
        metavar="N",
    )
    max_num_seqs: int | None = setting(
        None, "--max-num-seqs", "sequences decoded together (default 32)", MODEL, **POSITIVE
    )
    max_num_batched_tokens: int | None = setting(
        None,
        "--max-num-batched-tokens",
        "prompt tokens prefilled per engine step (default 512)",
        MODEL,
        **POSITIVE,
    )
    kv_cache_dtype: str = setting(
        "auto",
        "--kv-cache-dtype",
        "auto, float32 or bfloat16 (vLLM's fp8 formats are GPU-only: ignored)",
        MODEL,
    )
    seed: int | None = setting(None, "--seed", "the engine's random seed", MODEL, **COUNT)
    quantization: str | None = setting(
        None,
        ("--quantization", "-q"),
        "weight-only int8 (both engines) or int4 (--engine openvino); vLLM's GPU methods "
        "(awq, gptq, fp8, ...) fail the load: model.json quantization",
        MODEL,
    )
    runner: str = setting(
        "auto",
        "--runner",
        "pooling: serve a generating model as an embedding model (last token, normalized)",
        MODEL,
        parse=choice("auto", "generate", "pooling"),
        metavar="auto|generate|pooling",
    )
    task: str = setting(
        "auto", "--task", "vLLM's older flag: embed is --runner pooling", MODEL, metavar="TASK"
    )
    trust_remote_code: bool = setting(
        False, "--trust-remote-code", "let transformers run the folder's own code", MODEL, bare=True
    )
    no_enable_prefix_caching: bool = setting(
        False,
        "--no-enable-prefix-caching",
        "turn prefix caching off (on by default, as in vLLM): model.json enable_prefix_caching",
        MODEL,
        bare=True,
    )
    generation_config: str = setting(
        "auto",
        "--generation-config",
        "vLLM's generation config source (auto, vllm or a folder); passed to model.json",
        MODEL,
    )
    enable_lora: bool = setting(
        False,
        "--enable-lora",
        "serve LoRA adapters beside the base model (model.json enable_lora)",
        MODEL,
        bare=True,
    )
    lora_modules: list[str] = setting(
        [],
        "--lora-modules",
        "adapters loaded at start, as name=path or JSON (model.json lora_modules)",
        MODEL,
        many=True,
        metavar="NAME=PATH",
    )
    max_loras: int | None = setting(
        None,
        "--max-loras",
        "adapters in one step (model.json max_loras; default 1)",
        MODEL,
        **POSITIVE,
    )
    max_lora_rank: int | None = setting(
        None,
        "--max-lora-rank",
        "the largest adapter rank loaded (model.json max_lora_rank; default 16)",
        MODEL,
        **POSITIVE,
    )
    # ---- the server
    host: str = setting("0.0.0.0", "--host", "address to listen on", SERVER)
    port: int = setting(8000, "--port", "the port of the API, /health and /metrics", SERVER, **PORT)
    api_key: list[str] = setting(
        [],
        "--api-key",
        "requests to /v1 (and vLLM's other guarded paths) need 'Authorization: Bearer KEY', "
        "one of these keys (default: $VLLM_API_KEY)",
        SERVER,
        many=True,
        metavar="KEY",
    )
    # ---- the OpenAI API
    chat_template: str | None = setting(
        None, "--chat-template", "a Jinja chat template (or its file)", API, metavar="TEMPLATE|FILE"
    )
    enable_auto_tool_choice: bool = setting(
        False,
        "--enable-auto-tool-choice",
        "tool_choice auto (Oceanus parses tool calls whenever the model has a parser)",
        API,
        bare=True,
    )
    tool_call_parser: str | None = setting(
        None,
        "--tool-call-parser",
        "the tool-call format: " + ", ".join(TOOL_CALL_PARSERS),
        API,
        parse=_parser_name("tool call parser", TOOL_CALL_PARSERS),
        metavar="|".join(TOOL_CALL_PARSERS),
    )
    reasoning_parser: str | None = setting(
        None,
        "--reasoning-parser",
        "set <think>...</think> apart as reasoning_content: " + ", ".join(REASONING_PARSERS),
        API,
        parse=_parser_name("reasoning parser", REASONING_PARSERS),
        metavar="|".join(REASONING_PARSERS),
    )
    # ---- Oceanus's own
    engine: str | None = setting(
        None,
        "--engine",
        "auto (default: openvino for Llama-family models where installed), transformers or "
        "openvino (docs/serving-your-llm.md, 'Two engines'): model.json engine",
        OCEANUS,
        parse=choice(*ENGINES),
        metavar="|".join(ENGINES),
    )
    log_verbose: int = setting(0, "--log-verbose", "verbose logging level", OCEANUS, **COUNT)

    def __post_init__(self) -> None:
        if not self.api_key and os.environ.get("VLLM_API_KEY"):
            self.api_key = [os.environ["VLLM_API_KEY"]]
        if not self.served_model_name and self.model:
            self.served_model_name = [self.model]
