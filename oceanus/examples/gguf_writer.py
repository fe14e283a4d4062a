"""A GGUF file written here from the examples' Llama folder (oceanus/examples/llm.py), for tests
and benchmarks of GGUF serving: nothing is downloaded and llama.cpp's converter is not needed.

Writes what llama.cpp's `convert_hf_to_gguf.py` writes for a Llama model and transformers'
GGUF loader reads back: the `llama.*` hyperparameters, the tensors under llama.cpp's names
(`token_embd`, `blk.N.attn_q`, ...; q and k rows permuted as llama.cpp permutes them), and the
tokenizer as a byte-level BPE (`tokenizer.ggml.model` "gpt2": tokens, merges, token types,
special token ids) with `tokenizer.chat_template`. Norms stay F32; the 2-D weights are F32, F16,
Q8_0 or Q4_0 (`gguf.quants.quantize`). Needs the `gguf` package (the `llm` extra).

    from oceanus.examples.gguf_writer import write_gguf
    path = write_gguf(cached_llm("tiny"), tmp / "tiny-q8_0.gguf", "Q8_0")
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

TENSOR_TYPES = ("F32", "F16", "Q8_0", "Q4_0")

_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _gguf_name(name: str) -> str:
    """A transformers Llama parameter name under llama.cpp's name."""
    stem = name.removesuffix(".weight")
    if stem == "model.embed_tokens":
        return "token_embd.weight"
    if stem == "model.norm":
        return "output_norm.weight"
    if stem == "lm_head":
        return "output.weight"
    _, _, index, rest = stem.split(".", 3)  # model.layers.N.<rest>
    return f"blk.{index}.{_LAYER_NAMES[rest]}.weight"


def _permute(weights: Any, heads: int) -> Any:
    """llama.cpp's q/k row order (rotary halves interleaved), which transformers' loader undoes."""
    rows = weights.shape[0]
    return (
        weights.reshape(heads, 2, rows // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def write_gguf(
    folder: str | os.PathLike[str], out: str | os.PathLike[str], tensor_type: str = "F32"
) -> pathlib.Path:
    """Write the Llama Hugging Face folder `folder` (the examples' generator model) as a GGUF
    file at `out` with its 2-D weights in `tensor_type` (F32, F16, Q8_0, Q4_0); returns `out`."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    if tensor_type not in TENSOR_TYPES:
        raise ValueError(f"tensor_type must be one of {TENSOR_TYPES}, got {tensor_type!r}")
    src = pathlib.Path(folder)
    config = json.loads((src / "config.json").read_text())
    if config.get("model_type") != "llama":
        raise ValueError(f"{src}: only Llama folders are converted, not {config.get('model_type')}")
    tokenizer_json = json.loads((src / "tokenizer.json").read_text())
    tokenizer_config = json.loads((src / "tokenizer_config.json").read_text())
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]

    path = pathlib.Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(src.name)
    writer.add_file_type(
        {
            "F32": gguf.LlamaFileType.ALL_F32,
            "F16": gguf.LlamaFileType.MOSTLY_F16,
            "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
            "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
        }[tensor_type]
    )
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(config.get("rms_norm_eps", 1e-6))
    theta = config.get("rope_theta") or (config.get("rope_parameters") or {}).get("rope_theta")
    writer.add_rope_freq_base(float(theta or 10000.0))
    writer.add_rope_dimension_count(config["hidden_size"] // heads)
    writer.add_vocab_size(config["vocab_size"])

    # The tokenizer: byte-level BPE, tokens in id order, the added (special) ones as CONTROL.
    vocab: dict[str, int] = dict(tokenizer_json["model"]["vocab"])
    added = {t["content"]: t["id"] for t in tokenizer_json.get("added_tokens", [])}
    vocab.update(added)
    tokens = [""] * config["vocab_size"]
    for token, index in vocab.items():
        if index < len(tokens):
            tokens[index] = token
    for index, token in enumerate(tokens):
        if not token:
            tokens[index] = f"[PAD{index}]"
    types = [
        gguf.TokenType.CONTROL if token in added else gguf.TokenType.NORMAL for token in tokens
    ]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer_json["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    # The tokenizer splits words with GPT-2's regex (ByteLevel, use_regex): llama.cpp's "gpt-2".
    # Its "default" adds splits (punctuation runs, digits) and tokenizes some texts otherwise.
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([int(t) for t in types])
    writer.add_token_merges(merges)
    for key, setter in (
        ("bos_token", writer.add_bos_token_id),
        ("eos_token", writer.add_eos_token_id),
        ("pad_token", writer.add_pad_token_id),
    ):
        special: Any = tokenizer_config.get(key)
        if isinstance(special, dict):
            special = special.get("content")
        if isinstance(special, str) and special in vocab:
            setter(vocab[special])
    writer.add_add_bos_token(False)  # the chat template writes `bos_token` itself
    template = tokenizer_config.get("chat_template")
    if template is None and (src / "chat_template.jinja").is_file():
        template = (src / "chat_template.jinja").read_text()
    if template:
        writer.add_chat_template(template)

    weights = load_file(str(src / "model.safetensors"))
    qtype = gguf.GGMLQuantizationType[tensor_type]
    for name in sorted(weights):
        data = weights[name].astype(np.float32)
        if name.endswith("q_proj.weight"):
            data = _permute(data, heads)
        elif name.endswith("k_proj.weight"):
            data = _permute(data, kv_heads)
        target = _gguf_name(name)
        if data.ndim == 1 or tensor_type == "F32":
            writer.add_tensor(target, np.ascontiguousarray(data))
        elif tensor_type == "F16":
            writer.add_tensor(target, np.ascontiguousarray(data.astype(np.float16)))
        else:
            packed = gguf.quants.quantize(np.ascontiguousarray(data), qtype)
            writer.add_tensor(target, packed, raw_dtype=qtype)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
