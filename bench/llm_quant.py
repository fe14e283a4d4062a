"""Weight precision against decode speed, both engines, in process: the examples' model greedy,
each configuration's engine loaded in turn, rounds alternated, medians.

For each configuration (engine, dtype, model.json's `quantization`) it reports the weights'
bytes as the engine holds them and decode tokens/s at each concurrency (every stream prefills
`--prompt-tokens` random ids, then decodes `--output-tokens` with EOS ignored; tokens/s counts
the output tokens over the time from the first submit to the last token).

    python bench/llm_quant.py [--size 100m] [--concurrency 1,8] [--rounds 3]
        [--configs transformers:float32,transformers:bfloat16,transformers:float32:int8,
                   openvino:float32,openvino:bfloat16,openvino:float32:int8,openvino:float32:int4]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import benchlib

DEFAULT_CONFIGS = (
    "transformers:float32,transformers:bfloat16,transformers:float32:int8,"
    "openvino:float32,openvino:bfloat16,openvino:float32:int8,openvino:float32:int4"
)


def load(config: str, folder: Path) -> Any:
    from oceanus.backends.llm.args import EngineArgs

    engine, dtype, *rest = config.split(":")
    args = EngineArgs(
        model=folder,
        tokenizer=folder,
        engine=engine,
        dtype=dtype,
        quantization=rest[0] if rest else None,
    )
    if engine == "openvino":
        from oceanus.backends.llm.openvino_engine import OpenVinoEngine

        return OpenVinoEngine(args, threads=None)
    from oceanus.backends.llm.engine import Engine

    return Engine(args)


def decode(engine: Any, streams: int, prompt_tokens: int, output_tokens: int) -> float:
    """Output tokens/s with `streams` requests submitted at once."""
    from oceanus.backends.llm.sampling import SamplingParams

    rng = random.Random(39)
    vocab = len(engine.tokenizer)
    left = threading.Semaphore(0)
    ends: list[float] = []

    def sink(out: Any) -> None:
        if out.finished:
            ends.append(time.perf_counter())
            left.release()

    params = SamplingParams(max_tokens=output_tokens, temperature=0.0, ignore_eos=True)
    began = time.perf_counter()
    for _ in range(streams):
        engine.submit([rng.randrange(8, vocab) for _ in range(prompt_tokens)], params, sink)
    for _ in range(streams):
        assert left.acquire(timeout=600), "a stream did not finish"
    return streams * output_tokens / (max(ends) - began)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="100m")
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--configs", default=DEFAULT_CONFIGS)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from oceanus.examples.llm import cached_llm

    folder = cached_llm(args.size)
    levels = [int(c) for c in args.concurrency.split(",")]
    configs = args.configs.split(",")
    load_before = benchlib.loadavg()
    speeds: dict[str, dict[int, list[float]]] = {c: {n: [] for n in levels} for c in configs}
    weights: dict[str, int] = {}
    for _ in range(args.rounds):
        for config in configs:  # alternated: each round sees the machine's load of the moment
            engine = load(config, folder)
            try:
                weights[config] = int(engine.weights_bytes)
                decode(engine, 1, 16, 4)  # warm-up: first-call allocations, the plugin's JIT
                for n in levels:
                    speeds[config][n].append(
                        decode(engine, n, args.prompt_tokens, args.output_tokens)
                    )
            finally:
                engine.close()
    base = configs[0]
    rows = []
    for config in configs:
        medians = {n: statistics.median(speeds[config][n]) for n in levels}
        rows.append(
            {
                "config": config,
                "weights_mb": round(weights[config] / 2**20, 1),
                **{f"tok_s_c{n}": round(medians[n], 1) for n in levels},
                **{
                    f"x_c{n}": round(medians[n] / statistics.median(speeds[base][n]), 2)
                    for n in levels
                },
            }
        )
    header = ["config", "weights MiB"] + [f"tok/s c={n} (x {base})" for n in levels]
    print(" | ".join(header))
    for row in rows:
        cells = [row["config"], str(row["weights_mb"])]
        cells += [f"{row[f'tok_s_c{n}']} ({row[f'x_c{n}']}x)" for n in levels]
        print(" | ".join(cells))
    result = {
        "size": args.size,
        "prompt_tokens": args.prompt_tokens,
        "output_tokens": args.output_tokens,
        "rounds": args.rounds,
        "load_before": load_before,
        "load_after": benchlib.loadavg(),
        "rows": rows,
        "samples": speeds,
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
