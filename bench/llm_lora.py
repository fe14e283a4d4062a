"""LoRA on the default LLM engine (issue 40): output tokens/s of one batch of streams with the
base model only (LoRA off, and LoRA on with no adapter asked), all streams on one adapter, and
three adapters and the base mixed in the same batch (a quarter each).

    python bench/llm_lora.py [--size 100m] [--streams 16] [--output-tokens 64] [--rank 16]
                             [--repeats 3] [--threads N] [--json out.json]

The adapters are random (A and B non-zero) and target every linear of the decoder layers, the
costliest case; they are written in peft's format here (safetensors + json), so the benchmark
needs no peft. The settings run interleaved, `--repeats` times each; the table shows medians."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SETTINGS = ("base, LoRA off", "base, LoRA on", "one adapter", "3 adapters + base")


def write_adapter(folder: Path, model: Any, rank: int, seed: int) -> Path:
    """A random adapter on every decoder linear of `model`, in peft's folder format."""
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in TARGETS and hasattr(module, "weight"):
            out_features, in_features = module.weight.shape
            key = f"base_model.model.{name}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, in_features, generator=generator)
            tensors[f"{key}.lora_B.weight"] = (
                torch.randn(out_features, rank, generator=generator) * 0.01
            )
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {"r": rank, "lora_alpha": 2 * rank, "target_modules": list(TARGETS)}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


def run(engine: Any, adapters: list[str | None], streams: int, output: int) -> float:
    """Output tokens/s of `streams` requests submitted at once, request i on adapters[i % n]."""
    from oceanus.backends.llm.sampling import SamplingParams

    done = threading.Semaphore(0)
    tokens = [0]

    def sink(out: Any) -> None:
        tokens[0] += len(out.token_ids)
        if out.finished:
            done.release()

    params = SamplingParams(max_tokens=output, temperature=0.0, ignore_eos=True)
    prompts = [
        engine.encode(f"Request {i}: the tide tables of port {i} say") for i in range(streams)
    ]
    start = time.perf_counter()
    with engine._cond:  # all arrive before the first step
        for index, prompt in enumerate(prompts):
            name = adapters[index % len(adapters)]
            engine.submit(prompt, params, sink, lora_name=name)
    for _ in prompts:
        assert done.acquire(timeout=1200)
    return tokens[0] / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="100m")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    from oceanus.backends.llm.args import EngineArgs
    from oceanus.backends.llm.engine import Engine
    from oceanus.examples.llm import cached_llm

    folder = cached_llm(args.size)
    with tempfile.TemporaryDirectory() as scratch:
        reference = AutoModelForCausalLM.from_pretrained(folder)
        modules = tuple(
            (f"a{i}", write_adapter(Path(scratch) / f"a{i}", reference, args.rank, i))
            for i in range(3)
        )
        del reference
        common: dict[str, Any] = {"model": folder, "tokenizer": folder, "dtype": "float32"}
        common["max_num_seqs"] = args.streams
        common["enable_prefix_caching"] = False  # every repeat computes its prompts
        plain = Engine(EngineArgs(**common), threads=args.threads)
        lora = Engine(
            EngineArgs(
                **common,
                enable_lora=True,
                max_loras=3,
                max_lora_rank=args.rank,
                lora_modules=modules,
            ),
            threads=args.threads,
        )
        plans: dict[str, tuple[Any, list[str | None]]] = {
            SETTINGS[0]: (plain, [None]),
            SETTINGS[1]: (lora, [None]),
            SETTINGS[2]: (lora, ["a0"]),
            SETTINGS[3]: (lora, [None, "a0", "a1", "a2"]),
        }
        rates: dict[str, list[float]] = {name: [] for name in SETTINGS}
        for _ in range(args.repeats):
            for name, (engine, adapters) in plans.items():
                rates[name].append(run(engine, adapters, args.streams, args.output_tokens))
        plain.close()
        lora.close()
    base = statistics.median(rates[SETTINGS[0]])
    print(
        f"load average {os.getloadavg()[0]:.2f}; {args.size}, {args.streams} streams x "
        f"{args.output_tokens} tokens, rank {args.rank}, median of {args.repeats}"
    )
    print(f"{'setting':<20} {'tokens/s':>9} {'vs base':>8}   runs")
    result: dict[str, Any] = {"args": vars(args), "load_average": os.getloadavg()[0]}
    for name in SETTINGS:
        median = statistics.median(rates[name])
        runs = " ".join(f"{r:.0f}" for r in rates[name])
        print(f"{name:<20} {median:>9.1f} {median / base:>8.2f}   {runs}")
        result[name] = {"median_tokens_per_s": median, "runs": rates[name]}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
