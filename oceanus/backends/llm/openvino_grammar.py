"""Structured output's grammars checked before the openvino engine's pipeline sees them.

GenAI compiles a request's grammar (xgrammar, inside the pipeline) in `step()`, when the request
is first sampled. One xgrammar refuses throws there and leaves the pipeline broken: with GenAI
2026.4.1 every later step fails, whoever's requests it holds (measured: dropping the culprit
does not help). The frontend's check (llguidance) does not catch them all: `\\p{L}` and `(?i)`
are regexes llguidance takes and xgrammar does not. So the worker first compiles each guided
request's grammar on a throwaway pipeline: a one-layer model of the same vocabulary with random
weights (traced once per vocabulary size, cached), the same tokenizer, one token generated.
It compiles exactly as the real pipeline will; when it throws, that request alone is refused
and the checker is built again (tens of ms)."""

from __future__ import annotations

import json
import re
import tempfile
from collections import OrderedDict
from itertools import count
from pathlib import Path
from typing import Any

from oceanus.backends.llm.openvino_export import EXPORT_VERSION, cache_root, cached_folder, export

VERDICTS_KEPT = 1024  # grammars whose verdict is remembered (their texts: kB each)
# "[08:58:06] /path/to/xgrammar-src/cpp/regex_converter.cc:75: " before xgrammar's own words
_XGRAMMAR_PLACE = re.compile(r"\[[\d:]+\] \S+:\d+: ")


def cached_checker_model(vocab: int) -> Path:
    """The checker's model: a Llama of `vocab` tokens, 1 layer, width 16, traced like ours."""
    target = cache_root() / f"grammar-check-v{EXPORT_VERSION}-{vocab}"
    return cached_folder(target, lambda staging: _make_model(vocab, staging))[0]


def _make_model(vocab: int, target: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=16,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    with tempfile.TemporaryDirectory() as folder:
        LlamaForCausalLM(config).save_pretrained(folder)
        export(Path(folder), target)


def structured_config(genai: Any, fields: dict[str, Any]) -> Any:
    """GenAI's StructuredOutputConfig for the engine's `fields`: its own keyword fields, or
    "tagged_json" [begin, JSON schema, end], a JSON value between two fixed strings (a tool
    call in its parser's markers) as GenAI's compound grammar."""
    config = genai.StructuredOutputConfig
    tagged = fields.get("tagged_json")
    if tagged is None:
        return config(**fields)
    begin, schema, end = tagged
    parts = [config.ConstString(begin)] if begin else []
    parts.append(config.JSONSchema(schema))
    if end:
        parts.append(config.ConstString(end))
    return config(compound_grammar=config.Concat(*parts))


class GrammarCheck:
    """`error(fields)`: "" when GenAI compiles the StructuredOutputConfig `fields`, else why."""

    def __init__(self, genai: Any, tokenizer: Any, vocab: int) -> None:
        self._genai = genai
        self._tokenizer = tokenizer
        self._folder = cached_checker_model(vocab)
        self._ids = count()
        self._pipe = self._build()
        # Verdicts by grammar: a client repeats its schema, and a check costs a compile (more
        # with a large vocabulary) in the worker's loop, between the steps of every stream.
        self._verdicts: OrderedDict[str, str] = OrderedDict()

    def _build(self) -> Any:
        scheduler = self._genai.SchedulerConfig()
        scheduler.num_kv_blocks = 4  # a one-token prompt and one token: the least it takes
        scheduler.max_num_seqs = 1
        scheduler.max_num_batched_tokens = 16
        scheduler.enable_prefix_caching = False
        return self._genai.ContinuousBatchingPipeline(
            str(self._folder),
            self._tokenizer,
            scheduler,
            "CPU",
            INFERENCE_PRECISION_HINT="f32",
            INFERENCE_NUM_THREADS=1,
        )

    def error(self, fields: dict[str, Any]) -> str:
        key = json.dumps(fields, sort_keys=True)
        if key in self._verdicts:
            self._verdicts.move_to_end(key)
            return self._verdicts[key]
        verdict = self._compile(fields)
        self._verdicts[key] = verdict
        if len(self._verdicts) > VERDICTS_KEPT:
            self._verdicts.popitem(last=False)
        return verdict

    def _compile(self, fields: dict[str, Any]) -> str:
        import numpy as np
        import openvino as ov

        config = self._genai.GenerationConfig()
        config.max_new_tokens = 1
        config.structured_output_config = structured_config(self._genai, fields)
        prompt = ov.Tensor(np.zeros((1, 1), dtype=np.int64))
        try:
            # Held: a handle let go drops its request before it is ever sampled.
            handle = self._pipe.add_request(next(self._ids), prompt, config)
            while self._pipe.has_non_finished_requests():
                self._pipe.step()
            del handle
        except Exception as exc:
            self._pipe = self._build()  # this one is broken now
            return _XGRAMMAR_PLACE.sub("", str(exc)).strip()
        return ""
