"""Structured output: a grammar that masks each step's logits so the reply parses (llguidance).

`guided_decoding` in `sampling_parameters` is what Triton's OpenAI frontend sends its vLLM
backend: a JSON object (or its text) of vLLM's GuidedDecodingParams, of which `json` (a JSON
schema), `json_object` (any JSON object), `regex`, `choice` (a list of strings) and `grammar`
(Lark) are read, and our own `tagged_json` ({"begin", "schema", "end"}: a JSON value between two
fixed strings), which the OpenAI frontend sends for `tool_choice: "required"` so that both
engines can serve it (the openvino engine's xgrammar reads no Lark). Why llguidance
(bench/investigations/grammar.py, docs/openai.md): no dependencies of its own
(xgrammar pulls torch, transformers and the GPU `triton` package), it compiles a schema for our
tokenizers in ~8 ms, and its mask costs ~10 us a token, nothing beside a decoding step.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from oceanus.core.errors import invalid_arg

if TYPE_CHECKING:  # torch is the Guide's alone: the openvino engine reads specs without it
    import torch

_KINDS = ("json", "json_object", "regex", "choice", "grammar", "tagged_json")
# JSON as `json.dumps` writes it: free whitespace would let a model wander in blanks (a schema's
# own "x-guidance" settings still win).
_JSON_STYLE: Any = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


def guided_kind(guided: str) -> tuple[str, Any]:
    """The one kind a `guided_decoding` text sets and its value; INVALID_ARG otherwise."""
    try:
        spec = json.loads(guided)
    except ValueError as exc:
        raise invalid_arg(f"guided_decoding is not valid JSON: {exc}") from None
    spec = (
        {k: v for k, v in spec.items() if v not in (None, False)} if isinstance(spec, dict) else {}
    )
    kinds = [k for k in _KINDS if k in spec]
    if len(kinds) != 1:
        raise invalid_arg(f"guided_decoding must set exactly one of {', '.join(_KINDS)}")
    return kinds[0], spec[kinds[0]]


# Only what is special in both engines' regex dialects: xgrammar (the openvino engine's) warns
# on needless escapes such as `re.escape`'s "\ " and "\-".
_SPECIAL = re.compile(r"([\\^$.|?*+()\[\]{}])")


def choice_regex(choices: Any) -> str:
    """A regex matching exactly one of `choices` (each taken literally)."""
    return "|".join(_SPECIAL.sub(r"\\\1", str(c)) for c in choices)


def tagged_json(value: Any) -> tuple[str, Any, str]:
    """`tagged_json`'s begin, schema and end; INVALID_ARG when it is not such an object."""
    if not isinstance(value, dict) or not isinstance(value.get("schema"), dict):
        raise invalid_arg("guided_decoding 'tagged_json' needs an object with a 'schema' object")
    return str(value.get("begin") or ""), value["schema"], str(value.get("end") or "")


def without_key(value: Any, key: str) -> Any:
    """`value` (parsed JSON) with `key` removed from every object in it."""
    if isinstance(value, dict):
        return {k: without_key(v, key) for k, v in value.items() if k != key}
    if isinstance(value, list):
        return [without_key(v, key) for v in value]
    return value


def grammar_of(guided: str) -> str:
    """The llguidance grammar for a `guided_decoding` text; INVALID_ARG if it is not one or
    does not compile."""
    try:
        import llguidance
    except ImportError:
        raise invalid_arg(
            "guided decoding needs the 'llguidance' package: pip install 'oceanus[llm]'"
        ) from None
    kind, value = guided_kind(guided)
    matcher = llguidance.LLMatcher
    if kind == "json":
        schema = value if isinstance(value, str) else json.dumps(value)
        grammar = matcher.grammar_from_json_schema(schema, defaults=_JSON_STYLE)
    elif kind == "json_object":
        grammar = matcher.grammar_from_json_schema('{"type": "object"}', defaults=_JSON_STYLE)
    elif kind == "regex":
        grammar = matcher.grammar_from_regex(str(value))
    elif kind == "choice":
        grammar = matcher.grammar_from_regex(choice_regex(value))
    elif kind == "tagged_json":
        begin, schema, end = tagged_json(value)
        parts = [json.dumps(begin)] if begin else []
        parts += ["value"] + ([json.dumps(end)] if end else [])
        grammar = matcher.grammar_from_lark(
            f"start: {' '.join(parts)}\nvalue: %json {json.dumps(schema)}"
        )
    else:
        grammar = matcher.grammar_from_lark(str(value))
    error = matcher.validate_grammar(grammar)
    if error:
        raise invalid_arg(f"guided_decoding cannot be compiled: {error}")
    return str(grammar)


class Guide:
    """One sequence's grammar state: `mask` before choosing, `advance` after."""

    def __init__(self, tokenizer: Any, grammar: str) -> None:
        import llguidance
        import torch

        self._matcher = llguidance.LLMatcher(tokenizer, grammar)
        words = (tokenizer.vocab_size + 31) // 32
        self._bits = torch.zeros(words, dtype=torch.int32)

    def mask(self, logits: torch.Tensor) -> None:
        """Disallowed tokens' logits to -inf (in place, `[vocab]` row)."""
        import torch

        bits = self._bits
        self._matcher.unsafe_compute_mask_ptr(bits.data_ptr(), bits.numel() * 4)
        shifts = torch.arange(32, dtype=torch.int32)
        allowed = ((bits.unsqueeze(1) >> shifts) & 1).reshape(-1).bool()
        size = min(allowed.numel(), logits.numel())
        keep = torch.zeros(logits.numel(), dtype=torch.bool)
        keep[:size] = allowed[:size]
        logits[~keep] = float("-inf")

    def advance(self, token: int) -> bool:
        """Consume the chosen token; whether the grammar is complete (the reply must stop)."""
        self._matcher.consume_token(token)
        return bool(self._matcher.is_stopped())


def llg_tokenizer(hf_tokenizer: Any, vocab: int, eos: int | None) -> Any:
    """llguidance's view of the model's tokenizer (~1 s for a big vocabulary: made once)."""
    import llguidance.hf

    return llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab, eos_token=eos)
