"""A Hugging Face causal LM folder -> the OpenVINO model OpenVINO GenAI's continuous-batching
pipeline runs (the `engine: "openvino"` option, openvino_engine.py).

The pipeline takes a *stateful* decoder as optimum-intel exports it: inputs `input_ids`,
`attention_mask`, `position_ids`, `beam_idx`; output `logits`; each layer's keys and values
read from a ReadValue (zeros `[batch, kv_heads, 0, head_dim]` at first), gathered by
`beam_idx`, concatenated with the new ones before a ScaledDotProductAttention, and written
back with an Assign. At load it rewrites every such attention into its paged attention.
optimum-intel pins its own transformers and torch (installing it would move both under the
rest of the server), so this module traces the decoder itself, through OpenVINO's PyTorch
frontend, for the Llama family (llama, mistral, qwen2: RMSNorm, rotary embeddings from the
model's own `inv_freq`, grouped-query attention, gated MLP), with the model's own modules for
every weight. Traced once per model folder and cached (`cached_ir`), in fp32: the pipeline's
precision is a runtime setting. The tokenizer converted to OpenVINO, which GenAI's structured
output needs, is cached apart from it (`cached_tokenizer`)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from oceanus.backends.llm import gguf_model
from oceanus.backends.llm.engine_choice import OPENVINO_ARCHITECTURES as ARCHITECTURES
from oceanus.core.errors import invalid_arg

# Bump when the traced graph changes: cached folders of an older layout are traced again.
EXPORT_VERSION = 1
MODEL_XML = "openvino_model.xml"
TOKENIZER_XML = "openvino_tokenizer.xml"


def cache_root() -> Path:
    base = os.environ.get("OCEANUS_CACHE_DIR", Path.home() / ".cache" / "oceanus")
    return Path(base) / "llm-openvino"


def folder_key(model: Path) -> str:
    """What identifies a model folder's contents (or a GGUF file's): every file's name, size
    and mtime."""
    digest = hashlib.sha256(f"v{EXPORT_VERSION}:{model.resolve()}".encode())
    for path in sorted(model.iterdir()) if model.is_dir() else [model]:
        if path.is_file():
            stat = path.stat()
            digest.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:24]


def check_architecture(model: Path) -> dict[str, Any]:
    """The folder's config.json (a GGUF file's metadata as one), or INVALID_ARG naming what
    this exporter takes."""
    if gguf_model.is_gguf(model):
        config: dict[str, Any] = gguf_model.config_of(model).to_dict()
    else:
        config = json.loads((model / "config.json").read_text())
    kind = config.get("model_type")
    if kind not in ARCHITECTURES:
        raise invalid_arg(
            f"the openvino engine converts {', '.join(ARCHITECTURES)} models; "
            f"'{model}' is model_type {kind!r}: use engine 'transformers' for it"
        )
    return config


def cached_ir(model: Path, quantization: str | None = None) -> tuple[Path, float]:
    """The model's OpenVINO folder, traced on first use (and its weights compressed when
    `quantization` is "int8" or "int4", from the cached fp32 one); returns it and the seconds
    spent."""
    check_architecture(model)
    target = cache_root() / folder_key(model)
    if quantization is None:
        return cached_folder(target, lambda staging: export(model, staging))
    plain, traced_s = cached_ir(model)
    compressed = plain.with_name(f"{plain.name}-{quantization}")
    folder, compress_s = cached_folder(
        compressed, lambda staging: compress(plain, staging, quantization)
    )
    return folder, traced_s + compress_s


def is_cached(model: Path) -> bool:
    """Whether the model's traced (float) folder is in the cache: its load traces nothing."""
    return (cache_root() / folder_key(model) / MODEL_XML).is_file()


def cached_tokenizer(tokenizer: Path, trust_remote_code: bool = False) -> Path:
    """The Hugging Face tokenizer folder converted to OpenVINO (tokenizer and detokenizer
    models), cached by the folder's contents. GenAI's structured output needs it: xgrammar
    reads the vocabulary from it. Kept apart from the traced model, so one conversion serves
    the float and the compressed IR alike, a model.json `tokenizer` of its own is honoured,
    and folders traced before it existed are not traced again."""
    target = cache_root() / f"{folder_key(tokenizer)}-tokenizer"
    return cached_folder(
        target, lambda s: _convert_tokenizer(tokenizer, s, trust_remote_code), TOKENIZER_XML
    )[0]


def _convert_tokenizer(tokenizer: Path, target: Path, trust_remote_code: bool) -> None:
    import openvino as ov
    import openvino_tokenizers
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tokenizer, trust_remote_code=trust_remote_code)
    encoder, decoder = openvino_tokenizers.convert_tokenizer(hf, with_detokenizer=True)
    ov.save_model(encoder, target / TOKENIZER_XML)
    ov.save_model(decoder, target / "openvino_detokenizer.xml")


def cached_folder(
    target: Path, make: Callable[[Path], None], marker: str = MODEL_XML
) -> tuple[Path, float]:
    """`target`, made by `make(staging)` in a staging folder unless its `marker` file is there
    already."""
    if (target / marker).is_file():
        return target, 0.0
    began = time.monotonic()
    staging = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        make(staging)
        staging.rename(target)  # whole or not at all: a crash leaves only a .tmp folder
    except OSError:
        if not (target / marker).is_file():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target, time.monotonic() - began


def export(model_dir: Path, target: Path) -> None:
    import openvino as ov
    import torch
    from transformers import AutoModelForCausalLM

    if gguf_model.is_gguf(model_dir):  # dequantized to float32 here; compress() may requantize
        hf: Any = gguf_model.load_model(model_dir, torch.float32).eval()
    else:
        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    config = hf.config
    layers = int(config.num_hidden_layers)
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    batch, new, past = 2, 3, 4
    example: list[Any] = [
        torch.ones(batch, new, dtype=torch.long),
        torch.ones(batch, past + new, dtype=torch.long),
        torch.arange(past, past + new)[None].expand(batch, new).contiguous(),
    ]
    example += [torch.zeros(batch, kv_heads, past, head_dim) for _ in range(2 * layers)]
    with torch.no_grad():
        model = ov.convert_model(
            _decoder(hf, heads, kv_heads, head_dim), example_input=tuple(example)
        )
    past_names = [f"past_key_values.{i}.{part}" for i in range(layers) for part in ("key", "value")]
    names = ["input_ids", "attention_mask", "position_ids", *past_names]
    for port, name in zip(model.inputs, names, strict=True):
        port.get_tensor().set_names({name})
    model.outputs[0].get_tensor().set_names({"logits"})
    shapes: dict[Any, Any] = {model.inputs[i]: ov.PartialShape([-1, -1]) for i in range(3)}
    for port in model.inputs[3:]:
        shapes[port] = ov.PartialShape([-1, kv_heads, -1, head_dim])
    model.reshape(shapes)
    _make_stateful(model, past_names, kv_heads, head_dim)
    ov.save_model(model, target / MODEL_XML, compress_to_fp16=False)
    if gguf_model.is_gguf(model_dir):
        config.save_pretrained(target)
        return
    for name in ("config.json", "generation_config.json"):
        if (model_dir / name).is_file():
            shutil.copy(model_dir / name, target / name)


def compress(plain: Path, target: Path, quantization: str) -> None:
    """The traced model with weight-only int8 (asymmetric, per output channel) or int4
    (symmetric, in groups along the input) weights, by NNCF's weight compression, which
    OpenVINO's CPU plugin runs without dequantizing the whole matrix. For int4, NNCF keeps the
    embedding and the head in int8, as OpenVINO's own int4 exports do."""
    import logging

    import nncf
    import openvino as ov

    nncf.set_log_level(logging.WARNING)  # not its per-layer statistics tables in the server's log
    model = ov.Core().read_model(plain / MODEL_XML)
    if quantization == "int8":
        compressed = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_ASYM)
    else:
        config = json.loads((plain / "config.json").read_text())
        compressed = nncf.compress_weights(
            model,
            mode=nncf.CompressWeightsMode.INT4_SYM,
            group_size=int4_group(config),
            ratio=1.0,
        )
    ov.save_model(compressed, target / MODEL_XML, compress_to_fp16=False)
    for name in ("config.json", "generation_config.json"):
        if (plain / name).is_file():
            shutil.copy(plain / name, target / name)


def int4_group(config: dict[str, Any]) -> int:
    """The largest of 128, 64, 32 that divides every linear's input width (the hidden size,
    the MLP's, the attention heads'); -1 (one scale per output channel) when none does."""
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    widths = (int(config["hidden_size"]), int(config["intermediate_size"]), heads * head_dim)
    for group in (128, 64, 32):
        if all(width % group == 0 for width in widths):
            return group
    return -1


def _make_stateful(model: Any, past_names: list[str], kv_heads: int, head_dim: int) -> None:
    """Each past input becomes a variable read (zeros at a sequence's start) gathered by
    `beam_idx`; each present output becomes that variable's write."""
    import openvino as ov
    from openvino import opset13 as ops
    from openvino.op.util import Variable, VariableInfo

    beam = ops.parameter([-1], ov.Type.i32, name="beam_idx")
    beam.output(0).get_tensor().set_names({"beam_idx"})
    ids = model.inputs[0].get_node()
    rows = ops.gather(
        ops.shape_of(ids), ops.constant([0], ov.Type.i64), ops.constant(0, ov.Type.i64)
    )
    empty = ops.broadcast(
        ops.constant(0.0, ov.Type.f32),
        ops.concat([rows, ops.constant([kv_heads, 0, head_dim], ov.Type.i64)], 0),
    )
    params = list(model.get_parameters())[3:]
    results = list(model.get_results())[1:]
    sinks = []
    for param, result, name in zip(params, results, past_names, strict=True):
        info = VariableInfo()
        info.data_shape = ov.PartialShape([-1, kv_heads, -1, head_dim])
        info.data_type = ov.Type.f32
        info.variable_id = name
        variable = Variable(info)
        read = ops.gather(ops.read_value(empty, variable), beam, 0)
        for target in list(param.output(0).get_target_inputs()):
            target.replace_source_output(read.output(0))
        sinks.append(ops.assign(result.input_value(0).get_node(), variable))
        model.remove_result(result)
        model.remove_parameter(param)
    model.add_sinks(sinks)
    model.add_parameters([beam])
    model.validate_nodes_and_infer_types()


def _decoder(hf: Any, heads: int, kv_heads: int, head_dim: int) -> Any:
    """The module to trace (defined here: torch is imported only when a model is traced)."""
    import torch

    class Decoder(torch.nn.Module):
        """The model's forward for tracing: past keys/values as flat inputs, the new ones as
        flat outputs, attention through SDPA (what the pipeline's rewrite looks for)."""

        def __init__(self, hf: Any, heads: int, kv_heads: int, head_dim: int) -> None:
            super().__init__()
            self.hf = hf
            self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim

        def _repeat_kv(self, x: Any) -> Any:
            b, n, s, d = x.shape
            group = self.heads // self.kv_heads
            return x[:, :, None, :, :].expand(b, n, group, s, d).reshape(b, n * group, s, d)

        def _rotate(self, x: Any) -> Any:
            half = self.head_dim // 2
            return torch.cat([-x[..., half:], x[..., :half]], dim=-1)

        def forward(
            self, input_ids: Any, attention_mask: Any, position_ids: Any, *past: Any
        ) -> Any:
            inner = self.hf.model
            rotary = inner.rotary_emb
            h = inner.embed_tokens(input_ids)
            freqs = position_ids[:, :, None].float() * rotary.inv_freq[None, None, :]
            angles = torch.cat([freqs, freqs], dim=-1)
            cos = (angles.cos() * rotary.attention_scaling)[:, None]
            sin = (angles.sin() * rotary.attention_scaling)[:, None]
            b, t = input_ids.shape
            total = past[0].shape[2] + t
            key_pos = torch.arange(total)[None, None, :]
            query_pos = (total - t + torch.arange(t))[None, :, None]
            allowed = (key_pos <= query_pos) & attention_mask[:, None, :].bool()
            mask = torch.where(allowed, 0.0, float("-inf"))[:, None]
            presents: list[Any] = []
            d = self.head_dim
            for i, layer in enumerate(inner.layers):
                attn = layer.self_attn
                x = layer.input_layernorm(h)
                q = attn.q_proj(x).view(b, t, self.heads, d).transpose(1, 2)
                k = attn.k_proj(x).view(b, t, self.kv_heads, d).transpose(1, 2)
                v = attn.v_proj(x).view(b, t, self.kv_heads, d).transpose(1, 2)
                q = q * cos + self._rotate(q) * sin
                k = k * cos + self._rotate(k) * sin
                k = torch.cat([past[2 * i], k], dim=2)
                v = torch.cat([past[2 * i + 1], v], dim=2)
                presents += [k, v]
                if self.kv_heads != self.heads:
                    k, v = self._repeat_kv(k), self._repeat_kv(v)
                out = torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, scale=attn.scaling
                )
                h = h + attn.o_proj(out.transpose(1, 2).reshape(b, t, self.heads * d))
                h = h + layer.mlp(layer.post_attention_layernorm(h))
            return (self.hf.lm_head(inner.norm(h)), *presents)

    return Decoder(hf, heads, kv_heads, head_dim)
