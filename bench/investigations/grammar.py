"""Structured output on CPU: llguidance against xgrammar on our generated tokenizers.

For one JSON schema: the time to compile it for the tokenizer, and the time to compute one
token mask while walking a valid reply token by token (median over the reply). Prints a table
and writes bench/results/grammar.json. Run: `python bench/investigations/grammar.py [tiny|100m]`.
"""

from __future__ import annotations

import json
import pathlib
import statistics
import sys
import time
from typing import Any

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["city", "days", "tags"],
    "additionalProperties": False,
}
REPLY = '{"city": "Paris", "days": 3, "tags": ["sunny", "warm"]}'


def _llguidance(tokenizer: Any, ids: list[int]) -> tuple[float, list[float]]:
    import llguidance
    import llguidance.hf
    import numpy as np

    started = time.perf_counter()
    lltok = llguidance.hf.from_tokenizer(tokenizer)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA))
    matcher = llguidance.LLMatcher(lltok, grammar)
    compile_s = time.perf_counter() - started
    mask = np.zeros(((lltok.vocab_size + 31) // 32,), dtype=np.int32)
    times = []
    for token in ids:
        started = time.perf_counter()
        matcher.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
        times.append(time.perf_counter() - started)
        assert matcher.consume_token(token), matcher.get_error()
    return compile_s, times


def _xgrammar(tokenizer: Any, ids: list[int]) -> tuple[float, list[float]]:
    import xgrammar

    started = time.perf_counter()
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer)
    compiled = xgrammar.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA))
    matcher = xgrammar.GrammarMatcher(compiled)
    compile_s = time.perf_counter() - started
    bitmask = xgrammar.allocate_token_bitmask(1, info.vocab_size)
    times = []
    for token in ids:
        started = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask)
        times.append(time.perf_counter() - started)
        assert matcher.accept_token(token)
    return compile_s, times


def main() -> None:
    size = sys.argv[1] if len(sys.argv) > 1 else "tiny"
    from transformers import AutoTokenizer

    from oceanus.examples.llm import cached_llm

    tokenizer = AutoTokenizer.from_pretrained(str(cached_llm(size)))
    ids = tokenizer.encode(REPLY, add_special_tokens=False)
    rows = {}
    for name, run in (("llguidance", _llguidance), ("xgrammar", _xgrammar)):
        try:
            compile_s, times = run(tokenizer, ids)
        except Exception as exc:  # a library that is missing or fails is reported, not fatal
            print(f"{name}: {type(exc).__name__}: {exc}")
            continue
        rows[name] = {
            "compile_ms": compile_s * 1e3,
            "mask_us_median": statistics.median(times) * 1e6,
            "mask_us_max": max(times) * 1e6,
        }
    print(f"model {size}, vocab {len(tokenizer)}, reply {len(ids)} tokens (shared machine)")
    print(f"{'library':<12} {'compile ms':>11} {'mask us p50':>12} {'mask us max':>12}")
    for name, row in rows.items():
        print(
            f"{name:<12} {row['compile_ms']:>11.1f} {row['mask_us_median']:>12.1f}"
            f" {row['mask_us_max']:>12.1f}"
        )
    out = pathlib.Path(__file__).resolve().parent.parent / "results"
    out.mkdir(exist_ok=True)
    (out / "grammar.json").write_text(json.dumps({"model": size, "results": rows}, indent=2))


if __name__ == "__main__":
    main()
