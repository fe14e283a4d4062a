"""What guided decoding costs on the openvino engine (docs/llm.md, "Guided decoding"): the
one-time tokenizer conversion and checker model, the grammar check each guided request pays
(openvino_grammar.py), and a request's end-to-end time guided against free, in process.

One-time costs are measured into a fresh cache folder (the real cache is left alone). The
end-to-end rows alternate free and guided requests (`--rounds` each, one stream, greedy, the
same prompt) and report medians; a guided request includes its check, the pipeline's own
compile of the grammar and the mask at each token. Guided replies stop when the grammar is
complete, so time per output token is compared, not time per request.

    python bench/llm_openvino_guided.py [--size 100m] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import benchlib

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "count": {"type": "integer"}},
    "required": ["ok", "count"],
}
GRAMMARS: dict[str, dict[str, str]] = {
    "json_schema": {"json_schema": json.dumps(SCHEMA)},
    "regex": {"regex": r"[0-9]{3}-[a-z]{2,8}"},
    "choice": {"regex": "yes|no|maybe so"},
    "refused (rebuild)": {"regex": r"\p{L}+"},
}


def one_time(folder: Path, vocab: int, repeats: int) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds to convert the tokenizer and trace the checker's model (a fresh cache; imports
    done before), and the median ms of each grammar's check (a new variant each time: xgrammar
    caches what it compiled)."""
    import openvino_genai as genai
    import openvino_tokenizers  # noqa: F401 - imported before the clock starts
    import torch  # noqa: F401
    from transformers import AutoTokenizer  # noqa: F401

    from oceanus.backends.llm import openvino_export
    from oceanus.backends.llm.openvino_grammar import GrammarCheck, cached_checker_model

    ir_dir, _ = openvino_export.cached_ir(folder)  # the real cache's (traced if need be)
    with tempfile.TemporaryDirectory() as cache:
        os.environ["OCEANUS_CACHE_DIR"] = cache
        began = time.perf_counter()
        converted = openvino_export.cached_tokenizer(folder)
        tokenizer_s = time.perf_counter() - began
        began = time.perf_counter()
        cached_checker_model(vocab)
        model_s = time.perf_counter() - began
        # As in the worker: the model's pipeline first (the CPU plugin's start is its cost).
        scheduler = genai.SchedulerConfig()
        scheduler.cache_size = 1
        main_pipe = genai.ContinuousBatchingPipeline(str(ir_dir), scheduler, "CPU", {})
        began = time.perf_counter()
        tokenizer = genai.Tokenizer(str(converted))
        check = GrammarCheck(genai, tokenizer, vocab)
        build_s = time.perf_counter() - began
        del main_pipe
        checks: dict[str, float] = {}
        for name, fields in GRAMMARS.items():
            times = []
            for i in range(repeats):
                variant = {k: _variant(k, v, i) for k, v in fields.items()}
                began = time.perf_counter()
                check.error(variant)
                times.append((time.perf_counter() - began) * 1000)
            checks[name] = statistics.median(times)
        del os.environ["OCEANUS_CACHE_DIR"]
    once = {"tokenizer_convert_s": tokenizer_s, "checker_model_s": model_s}
    once["tokenizer_and_checker_load_s"] = build_s  # what each engine start adds
    return once, checks


def _variant(kind: str, value: str, i: int) -> str:
    """The grammar `value` made distinct for repeat `i` (same shape, new text)."""
    if kind == "json_schema":
        return json.dumps({**json.loads(value), "description": f"variant {i}"})
    return f"{value}|v{i}" if "p{" not in value else value + "{" + str(i + 1) + "}"


def request(
    engine: Any, prompt: list[int], guided: str | None, max_tokens: int
) -> tuple[int, float]:
    """Output tokens and seconds from submit to the last one."""
    from oceanus.backends.llm.sampling import SamplingParams

    done = threading.Event()
    tokens = [0]

    def sink(out: Any) -> None:
        tokens[0] = out.num_output_tokens
        if out.finished:
            done.set()

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, guided_decoding=guided)
    began = time.perf_counter()
    engine.submit(prompt, params, sink)
    assert done.wait(600), "the request did not finish"
    return tokens[0], time.perf_counter() - began


def end_to_end(folder: Path, rounds: int, max_tokens: int) -> list[dict[str, Any]]:
    from oceanus.backends.llm.args import EngineArgs
    from oceanus.backends.llm.openvino_engine import OpenVinoEngine

    engine = OpenVinoEngine(EngineArgs(model=folder, tokenizer=folder, engine="openvino"))
    kinds: dict[str, str | None] = {
        "free": None,
        "json_schema": json.dumps({"json": SCHEMA}),
        "regex": json.dumps({"regex": GRAMMARS["regex"]["regex"]}),
    }
    samples: dict[str, list[tuple[int, float]]] = {k: [] for k in kinds}
    try:
        prompt = engine.encode("Describe the weather in one short answer, please.")
        request(engine, prompt, None, 4)  # warm-up
        for _ in range(rounds):
            for kind, guided in kinds.items():
                samples[kind].append(request(engine, prompt, guided, max_tokens))
    finally:
        engine.close()
    rows = []
    for kind, runs in samples.items():
        per_token = statistics.median(s / max(n, 1) * 1000 for n, s in runs)
        rows.append(
            {
                "request": kind,
                "tokens": statistics.median(n for n, _ in runs),
                "ms": statistics.median(s for _, s in runs) * 1000,
                "ms_per_token": per_token,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="100m")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from oceanus.examples.llm import cached_llm

    folder = cached_llm(args.size)
    vocab = int(json.loads((folder / "config.json").read_text())["vocab_size"])
    load_before = benchlib.loadavg()
    once, checks = one_time(folder, vocab, args.rounds)
    rows = end_to_end(folder, args.rounds, args.max_tokens)
    print(f"model {args.size} (vocabulary {vocab}), load average before {load_before}")
    print(benchlib.table(["one-time", "s"], [[k, f"{v:.2f}"] for k, v in once.items()]))
    print(
        benchlib.table(
            ["grammar check", "ms (median)"], [[k, f"{v:.1f}"] for k, v in checks.items()]
        )
    )
    free = rows[0]["ms_per_token"]
    print(
        benchlib.table(
            ["request", "tokens", "ms (median)", "ms/token", "x free"],
            [
                [
                    r["request"],
                    r["tokens"],
                    f"{r['ms']:.0f}",
                    f"{r['ms_per_token']:.1f}",
                    f"{r['ms_per_token'] / free:.2f}",
                ]
                for r in rows
            ],
        )
    )
    result = {
        "size": args.size,
        "vocab": vocab,
        "rounds": args.rounds,
        "load_before": load_before,
        "load_after": benchlib.loadavg(),
        "one_time_s": once,
        "check_ms": checks,
        "requests": rows,
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
