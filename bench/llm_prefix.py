"""Prefix caching on the default LLM engine (issue 39): requests that share a long system prompt,
one after another; the time to first token of the first (nothing cached) against the later
ones (the shared blocks are copied from the cache, only each request's own question is
prefilled), with prefix caching on and off (model.json `enable_prefix_caching`).

    python bench/llm_prefix.py [--size 100m] [--system-tokens 1000] [--requests 5]
                               [--output-tokens 16] [--threads N] [--engine auto]
                               [--dtype auto]

Prints one JSON line per setting: each request's TTFT in ms, the later ones' median over the
first's, each request's decode time per output token (a hit must not slow decode), and the
engine's prefix-cache counters (vLLM's queries and hits, in tokens; the openvino engine's
cache is OpenVINO GenAI's, which counts none)."""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


def run(args: argparse.Namespace, caching: bool) -> dict[str, Any]:
    from oceanus.backends.llm.args import read_engine_args
    from oceanus.backends.llm.backend import make_engine
    from oceanus.backends.llm.sampling import SamplingParams
    from oceanus.backends.llm.scheduler import StepOutput
    from oceanus.examples.llm import cached_llm

    size, system, output = args.size, args.system_tokens, args.output_tokens
    folder = cached_llm(size)
    keys = {"model": str(folder), "enable_prefix_caching": caching, "dtype": args.dtype}
    keys["engine"] = args.engine
    with tempfile.TemporaryDirectory() as version:
        (Path(version) / "model.json").write_text(json.dumps(keys))
        engine_args = read_engine_args(Path(version), "llm")
    engine = make_engine(engine_args, threads=args.threads)
    try:
        words = "The tide tables list the high and low water of every port along the coast. "
        prefix = engine.encode(words * (system // 25 + 1))[:system]  # ~33 tokens a sentence
        ttfts: list[float] = []
        decode: list[float] = []  # each request's ms per output token after the first
        for index in range(args.requests):
            question = engine.encode(f" Question {index}: when is high water at port {index}?")
            prompt = prefix + question[1:]  # no second BOS
            done = threading.Event()
            first: list[float] = []

            def sink(out: StepOutput, first: list[float] = first, done: Any = done) -> None:
                if out.token_ids:
                    first.append(time.perf_counter())  # every token's time; [0] the first's
                if out.finished:
                    done.set()

            params = SamplingParams(max_tokens=output, temperature=0.0, ignore_eos=True)
            start = time.perf_counter()
            engine.submit(prompt, params, sink)
            assert done.wait(600)
            ttfts.append((first[0] - start) * 1000)
            decode.append((first[-1] - first[0]) * 1000 / max(1, len(first) - 1))
        counters = engine.counters
        return {
            "size": size,
            "engine": f"{engine_args.engine} ({engine_args.engine_source})",
            "dtype": engine_args.dtype,
            "enable_prefix_caching": caching,
            "system_tokens": len(prefix),
            "ttft_ms": [round(t, 1) for t in ttfts],
            "later_over_first": round(statistics.median(ttfts[1:]) / ttfts[0], 3),
            "decode_ms_per_token": [round(t, 1) for t in decode],
            "prefix_cache_queries": counters.prefix_cache_queries,
            "prefix_cache_hits": counters.prefix_cache_hits,
        }
    finally:
        engine.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="100m")
    parser.add_argument("--system-tokens", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--output-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--engine", default="auto", help="model.json engine")
    parser.add_argument("--dtype", default="auto", help="model.json dtype")
    args = parser.parse_args()
    for caching in (True, False):
        print(json.dumps(run(args, caching)), flush=True)


if __name__ == "__main__":
    main()
