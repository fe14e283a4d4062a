"""Loading a causal language model for the engine: tokenizer, model, and the engine's fast
paths (oneDNN linears and fused MLPs, linear.py; row attention, attention.py), each checked at
load and left off when this build or model cannot take it. The encoders (embedder.py,
classifier.py) load here too, under the same lock."""

from __future__ import annotations

import inspect
import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from oceanus.backends.llm import attention, gguf_model, linear, quant
from oceanus.backends.llm.args import EngineArgs

log = logging.getLogger("oceanus.backends.llm")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

# transformers' from_pretrained(dtype=...) sets torch's process-wide default dtype while it
# builds the model: two models of different dtypes loading at once (a server loads its models
# in parallel) would each get some weights in the other's dtype: a bfloat16 engine beside the
# float32 embedder got float32 norms, and its packed bfloat16 head refused their float32 output.
# One transformers load at a time, for every model of this backend (embedder.py takes it too).
LOADING = threading.Lock()


@dataclass(slots=True)
class LoadedModel:
    tokenizer: Any
    model: Any
    dtype: torch.dtype
    kv_dtype: torch.dtype  # the KV cache's (model.json's kv_cache_dtype; "auto": `dtype`)
    weights_bytes: int  # the parameters as loaded (int8 if quantized; before oneDNN packs)
    packed_linears: int  # how many linears run on oneDNN (0: the default path)
    fused_mlps: int
    row_attention: bool
    cache_kw: str  # transformers 5 names the cache argument `cache`, earlier `past_key_values`
    keep_kw: bool  # whether forward takes `logits_to_keep`


def load(
    args: EngineArgs, onednn_linears: bool, fused_mlp: bool, row_attention: bool
) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no progress bars in the server's log

    dtype = DTYPES[args.dtype]
    remote = args.trust_remote_code
    gguf = gguf_model.is_gguf(Path(args.model))
    if gguf and Path(args.tokenizer) == gguf_model.tokenizer_dir(Path(args.model)):
        tokenizer = gguf_model.save_tokenizer(Path(args.model), Path(args.tokenizer), remote)
    else:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer, trust_remote_code=remote)
    with LOADING:
        if gguf:
            model: Any = gguf_model.load_model(Path(args.model), dtype, remote).eval()
        else:
            model = AutoModelForCausalLM.from_pretrained(
                args.model, dtype=dtype, trust_remote_code=remote
            ).eval()
    if args.quantization == "int8":
        before = quant.module_bytes(model)
        count = quant.quantize_linears(model)
        log.info(
            "quantization int8: %d linears weight-only int8 (per output channel), weights "
            "%.1f MiB -> %.1f MiB",
            count,
            before / 2**20,
            quant.module_bytes(model) / 2**20,
        )
    weights = quant.module_bytes(model)
    # The matmuls are most of a step: run them on oneDNN with packed weights (linear.py).
    packed = fused = 0
    if onednn_linears and linear.usable(dtype):
        packed = linear.pack_linears(model)
        fused = linear.fuse_mlps(model) if fused_mlp and packed else 0
    # Decode attention reads each sequence's own cells, not the batch's longest (attention.py).
    rows = row_attention and model.config._attn_implementation == "sdpa"
    if rows:
        model.set_attn_implementation(attention.register())
    forward = inspect.signature(model.forward).parameters
    return LoadedModel(
        tokenizer=tokenizer,
        model=model,
        dtype=dtype,
        kv_dtype=DTYPES.get(args.kv_cache_dtype, dtype),
        weights_bytes=weights,
        packed_linears=packed,
        fused_mlps=fused,
        row_attention=rows,
        cache_kw="cache" if "cache" in forward else "past_key_values",
        keep_kw="logits_to_keep" in forward,
    )


def read_json(path: Path) -> Any:
    """A JSON file of a model folder, or None where it is missing or not JSON."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def load_encoder(args: EngineArgs, auto_class: str) -> tuple[Any, Any]:
    """An encoder model of this backend (embedder.py's `AutoModel`, classifier.py's
    `AutoModelForSequenceClassification`): its tokenizer, and the model in eval mode, built
    under LOADING as the engine's is."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(args.tokenizer)
    with LOADING:
        model = getattr(transformers, auto_class).from_pretrained(args.model)
    return tokenizer, model.eval()
