"""A small cross-encoder (reranker) made here: a BERT `BertForSequenceClassification` with one
label and seeded random weights, and our locally trained byte-level BPE tokenizer
(tokenizer.py) with a pair template (`<begin> query <end> document <end>`, token types 0 and 1,
as BERT's [CLS] a [SEP] b [SEP]) -- in a Triton vLLM folder (`backend: "vllm"`,
`1/model.json`), which the engine serves as a scoring model because the model's own config
names a `*ForSequenceClassification` architecture. Its scores are meaningless but
deterministic; tests compare them with transformers' own."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from oceanus.examples.tokenizer import BOS, EOS, VOCAB_SIZE, write_tokenizer

WIDTH = 64
MAX_LENGTH = 128


def write_hf_cross_encoder(folder: Path, num_labels: int = 1) -> Path:
    """The Hugging Face folder: config (with `num_labels`), weights and the pair tokenizer."""
    import torch
    from tokenizers import Tokenizer, processors
    from transformers import BertConfig, BertForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    folder.mkdir(parents=True, exist_ok=True)
    write_tokenizer(folder)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = {token: tokenizer.token_to_id(token) for token in (BOS, EOS)}
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A {EOS}",
        pair=f"{BOS} $A {EOS} $B:1 {EOS}:1",
        special_tokens=list(ids.items()),
    )
    tokenizer.save(str(folder / "tokenizer.json"))
    config_path = folder / "tokenizer_config.json"
    settings = json.loads(config_path.read_text())
    settings.pop("chat_template", None)  # a scorer, not a chat model
    settings["model_max_length"] = MAX_LENGTH
    settings["model_input_names"] = ["input_ids", "token_type_ids", "attention_mask"]
    config_path.write_text(json.dumps(settings, indent=2))
    torch.manual_seed(0)
    config = BertConfig(  # type: ignore[call-arg]  # num_labels: PretrainedConfig's kwargs
        vocab_size=VOCAB_SIZE,
        hidden_size=WIDTH,
        num_hidden_layers=2,
        num_attention_heads=1,  # head size 64: vLLM's CPU attention refuses 16
        intermediate_size=128,
        max_position_embeddings=MAX_LENGTH,
        type_vocab_size=2,
        pad_token_id=0,
        num_labels=num_labels,
    )
    BertForSequenceClassification(config).eval().save_pretrained(str(folder))
    return folder


def write_cross_encoder_model(
    repository: Path, name: str = "reranker", num_labels: int = 1
) -> Path:
    """The Triton model folder `repository/name`: config.pbtxt, `1/model.json` naming `hf/`."""
    model = repository / name
    if model.exists():
        shutil.rmtree(model)
    (model / "1").mkdir(parents=True)
    write_hf_cross_encoder(model / "hf", num_labels)
    (model / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "vllm"\n')
    (model / "1" / "model.json").write_text(json.dumps({"model": "../hf"}, indent=2) + "\n")
    return model
