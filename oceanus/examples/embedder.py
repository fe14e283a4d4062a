"""A small embedding model made here: a BERT encoder with seeded random weights, our locally
trained byte-level BPE tokenizer (tokenizer.py), and sentence-transformers files saying "mean
pooling, then normalize" -- in a Triton vLLM folder (`backend: "vllm"`, `1/model.json`), which
the engine serves as an embedding model because the model's own config has no LM head."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from oceanus.examples.tokenizer import VOCAB_SIZE, write_tokenizer

EMBEDDING_WIDTH = 64
MAX_LENGTH = 128


def write_hf_embedder(folder: Path) -> Path:
    """The Hugging Face folder: config, weights, tokenizer, sentence-transformers modules."""
    import torch
    from transformers import BertConfig, BertModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    folder.mkdir(parents=True, exist_ok=True)
    write_tokenizer(folder)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=EMBEDDING_WIDTH,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=MAX_LENGTH,
        pad_token_id=0,
    )
    BertModel(config).eval().save_pretrained(str(folder))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
        {
            "idx": 2,
            "name": "2",
            "path": "2_Normalize",
            "type": "sentence_transformers.models.Normalize",
        },
    ]
    (folder / "modules.json").write_text(json.dumps(modules, indent=2))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    pooling = {"word_embedding_dimension": EMBEDDING_WIDTH, "pooling_mode_mean_tokens": True}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2))
    (folder / "2_Normalize").mkdir(exist_ok=True)
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": MAX_LENGTH}))
    return folder


def write_embedding_model(repository: Path, name: str = "embedder") -> Path:
    """The Triton model folder `repository/name`: config.pbtxt, `1/model.json` naming `hf/`."""
    model = repository / name
    if model.exists():
        shutil.rmtree(model)
    (model / "1").mkdir(parents=True)
    write_hf_embedder(model / "hf")
    (model / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "vllm"\n')
    (model / "1" / "model.json").write_text(json.dumps({"model": "../hf"}, indent=2) + "\n")
    return model
