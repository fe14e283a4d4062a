"""A language model for tests, examples and benchmarks, made locally (nothing is downloaded).

A Llama-architecture model with seeded random weights and a byte-level BPE tokenizer trained
here (the `tokenizers` library) on a built-in text, saved as a Hugging Face folder
(config.json, model.safetensors, tokenizer.json, tokenizer_config.json with a chat template)
that transformers' `from_pretrained` and our LLM backend read. Needs the `llm` extra
(torch, transformers, tokenizers); imported only when such a model is asked for.

    from oceanus.examples.llm import write_llm, llm_repository
    folder = write_llm(path, "tiny")          # the Hugging Face folder
    repo = llm_repository(path)               # a Triton repository with a vLLM-style model
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
from dataclasses import dataclass

# Bump when any generated file changes (cached folders carry it in their path).
LLM_GENERATOR_VERSION = 2  # 2: the 100m model with 2816-wide MLPs (~98 M parameters)

SEED = 20261204

# A Llama-3-like chat template (Jinja, as transformers' apply_chat_template reads it).
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|start|>{{ message['role'] }}\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|pad|>", "<|begin|>", "<|eos|>", "<|start|>", "<|end|>"]

# The tokenizer's training text: enough distinct words for a few hundred merges.
_TEXT = """
The ocean covers most of the planet and holds most of its water. Tides rise and fall twice a
day, pulled by the moon and the sun. Waves carry energy across thousands of kilometres before
they break on a shore. Deep below the surface it is dark and cold, and the pressure is great.
Fish, whales, turtles, crabs, corals and countless tiny plankton live in the sea. Sailors once
steered by the stars; today ships follow satellites. A lighthouse warns them of rocks at night.
An inference server answers requests: it loads models, batches inputs, runs them on a processor
and returns outputs. Language models read a prompt as tokens and write one token at a time.
Each new token depends on every token before it, so the server keeps a cache of keys and
values for every sequence it is generating. Continuous batching lets new requests join while
others are still writing, and a finished sequence leaves at once to make room for the next.
Hello world! How are you today? I am fine, thank you. What is the weather like? It is sunny
and warm, with a light breeze from the west. Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000.
Questions, answers, stories, poems, code: def main(): return 42 if x > 0 else -1
"""


@dataclass(frozen=True)
class LlmSize:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    # Rows of the embedding and output layers when more than the trained tokenizer's (which
    # holds far fewer tokens than asked on this small text): the real model's parameter count.
    model_vocab_size: int = 0


SIZES: dict[str, LlmSize] = {
    # ~0.5 M parameters: the tests' model, generated in well under a second.
    "tiny": LlmSize(512, 64, 128, 2, 4, 2, 1024),
    # ~100 M parameters: the benchmarks' model, generated on demand.
    "100m": LlmSize(8192, 768, 2816, 12, 12, 4, 2048),
    # The shape of SmolLM2-135M-Instruct (30 layers, hidden 576, 9 heads / 3 KV heads, MLP
    # 1536, vocabulary 49,152), embeddings untied: 163 M parameters, for issue 39's memory
    # and speed targets on "a real 135 M model" (none may be downloaded here).
    "135m": LlmSize(8192, 576, 1536, 30, 9, 3, 2048, model_vocab_size=49152),
}


def train_tokenizer(vocab_size: int) -> object:
    """A byte-level BPE tokenizer trained on the built-in text (deterministic)."""
    from oceanus.examples.tokenizer import train_bpe

    return train_bpe(_TEXT, vocab_size, SPECIAL_TOKENS)


def write_llm(folder: str | os.PathLike[str], size: str = "tiny") -> pathlib.Path:
    """Write the model of `size` as a Hugging Face folder; returns the folder."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    spec = SIZES[size]
    out = pathlib.Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    raw = train_tokenizer(spec.vocab_size)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token="<|begin|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
        model_max_length=spec.max_position_embeddings,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)
    # The tokenizer may hold fewer tokens than asked for on a small text: size the model to it.
    vocab = max(len(tokenizer), spec.model_vocab_size)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    # Random weights of std 0.02 give near-uniform logits; a larger scale on the output layer
    # makes greedy choices decisive, so that exact-equality tests are not decided by ties.
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 0.5)
    model.generation_config.do_sample = False
    model.save_pretrained(out)
    return out


def cached_llm(size: str = "tiny") -> pathlib.Path:
    """The model of `size` in the examples' cache, generated on first use."""
    root = pathlib.Path(
        os.environ.get("OCEANUS_CACHE_DIR", pathlib.Path.home() / ".cache" / "oceanus")
    )
    target = root / "llm" / f"v{LLM_GENERATOR_VERSION}" / size
    if (target / "model.safetensors").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Written aside and renamed, so that a concurrent user never sees half a folder.
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{size}-", dir=target.parent))
    write_llm(staging, size)
    try:
        staging.rename(target)
    except OSError:  # another process got there first
        import shutil

        shutil.rmtree(staging, ignore_errors=True)
    return target


LLM_MODEL_NAME = "llm_tiny"


def llm_config(name: str = LLM_MODEL_NAME, backend: str = "vllm") -> str:
    """A vLLM-backend config.pbtxt: the rest is auto-completed, as Triton's vLLM backend does."""
    return f'name: "{name}"\nbackend: "{backend}"\n'


def write_llm_model(
    repository: str | os.PathLike[str],
    name: str = LLM_MODEL_NAME,
    size: str = "tiny",
    backend: str = "vllm",
    engine_args: dict[str, object] | None = None,
) -> pathlib.Path:
    """A Triton model folder <repository>/<name> with `1/model.json` naming the cached model.
    It says `dtype: "float32"` and `engine: "transformers"`, so that tests and benchmarks
    compare with transformers in fp32 whatever the CPU and whatever is installed ("auto" is
    bfloat16 on CPUs with AVX512-BF16 or AMX, and engine "auto" picks openvino where
    openvino-genai is installed); `engine_args` override them."""
    folder = pathlib.Path(repository) / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(llm_config(name, backend))
    args: dict[str, object] = {
        "model": str(cached_llm(size)),
        "max_model_len": 1024,
        "seed": 0,
        "dtype": "float32",
        "engine": "transformers",
    }
    args.update(engine_args or {})
    (folder / "1" / "model.json").write_text(json.dumps(args, indent=2) + "\n")
    return folder
