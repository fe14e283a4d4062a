"""A small byte-level BPE tokenizer trained here on a built-in text, with a chat template.

Language-model examples need a tokenizer whose files look like a Hugging Face model's
(`tokenizer.json`, `tokenizer_config.json` with `chat_template`), and nothing may be
downloaded: `write_tokenizer(folder)` trains one in well under a second with the `tokenizers`
library. The chat template is ChatML with Hermes-style tool calls (`<tool_call>` JSON), the
format the OpenAI frontend's `hermes` parser reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

BOS, EOS, PAD = "<|begin_of_text|>", "<|im_end|>", "<|pad|>"
SPECIAL_TOKENS = [PAD, BOS, EOS, "<|im_start|>"]
VOCAB_SIZE = 512

# Enough English, JSON and markup for merges that make tokens of several bytes.
_TEXT = """
The quick brown fox jumps over the lazy dog. A language model reads tokens and writes tokens.
Hello, how are you today? I am fine, thank you. What is the weather like in Paris and London?
The weather is sunny with a high of 21 degrees. Please call the function with these arguments.
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
<tool_call>{"name": "lookup", "arguments": {"query": "oceanus"}}</tool_call>
{"answer": 42, "items": [1, 2, 3], "ok": true, "text": "a string value", "none": null}
system user assistant tool You are a helpful assistant. Answer briefly and in JSON if asked.
Once upon a time there was an inference server that spoke every protocol its users needed.
"""

CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "You can call these tools: {{ tools | tojson }}\n"
    'Call one as <tool_call>{"name": ..., "arguments": {...}}</tool_call><|im_end|>\n'
    "{% endif %}"
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n"
    "{%- if message.content is string %}{{ message.content }}"
    "{%- elif message.content %}{% for part in message.content %}"
    "{% if part.type == 'text' %}{{ part.text }}{% endif %}{% endfor %}{% endif %}"
    "{%- if message.tool_calls %}{% for call in message.tool_calls %}"
    "<tool_call>{{ call.function | tojson }}</tool_call>{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def train_bpe(text: str, vocab_size: int, special_tokens: list[str]) -> Any:
    """A byte-level BPE tokenizer (a `tokenizers.Tokenizer`) trained on `text`: deterministic,
    well under a second; the one trainer of the examples' language and embedding models."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([text] * 4, trainer=trainer)
    return tokenizer


def write_tokenizer(folder: Path) -> None:
    """Train the tokenizer and write `tokenizer.json` and `tokenizer_config.json` into folder."""
    tokenizer = train_bpe(_TEXT, VOCAB_SIZE, SPECIAL_TOKENS)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "model_max_length": 256,
        "chat_template": CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
