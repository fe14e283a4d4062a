"""Time one decode step of the CPU LLM engine: `batch` running sequences, each past a prompt of
random length, one token each, in process (no server, no sampling loop around it).

    python bench/investigations/llm_step.py [--size 100m] [--batch 32] [--context 32,512]
        [--steps 20]
                             [--threads N] [--profile] [--compare onednn_linears|row_attention|
                             fused_mlp|both] [--dtype float32[,bfloat16]] [--cpu-time]

Prints the median ms of a decode pass (the engine's own `_forward`, then a batched argmax) and,
with --profile, torch.profiler's table of operators by self CPU time. --compare loads a second
engine without the named change(s) and alternates their passes (same load for both); --dtype
float32,bfloat16 loads the model (and its KV cache) in each dtype, alternated likewise. Writes
bench/results/llm-step-<size>.json."""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="100m")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", default="32,512", help="min,max tokens already in the cache")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--max-len", type=int, default=776)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument(
        "--compare",
        choices=["onednn_linears", "row_attention", "fused_mlp", "both"],
        help="also an engine without this change, its steps alternated with the default's",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: its default)")
    parser.add_argument("--dtype", default="float32", help="model.json dtype(s), comma-separated")
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time each pass in process CPU time, not wall time (steadier on a loaded machine; "
        "with --threads 1 it is the pass's work)",
    )
    args = parser.parse_args()

    from oceanus.backends.llm.args import EngineArgs
    from oceanus.backends.llm.engine import Engine, Sequence
    from oceanus.backends.llm.sampling import SamplingParams
    from oceanus.examples.llm import cached_llm

    folder = cached_llm(args.size)
    if args.threads:
        torch.set_num_threads(args.threads)
    variants: dict[str, tuple[str, dict[str, bool]]] = {}
    for dtype in args.dtype.split(","):
        suffix = "" if dtype == "float32" else f" {dtype}"
        variants[f"default{suffix}"] = (dtype, {})
        if args.compare:
            off = (
                ["onednn_linears", "row_attention", "fused_mlp"]
                if args.compare == "both"
                else [args.compare]
            )
            variants[f"without {args.compare}{suffix}"] = (dtype, {name: False for name in off})
    engines: dict[str, Engine] = {}
    load_s: dict[str, float] = {}
    for name, (dtype, switches) in variants.items():
        started = time.perf_counter()
        engine_args = EngineArgs(
            model=folder, tokenizer=folder, max_model_len=args.max_len, max_num_seqs=32, dtype=dtype
        )
        engines[name] = Engine(engine_args, threads=torch.get_num_threads(), **switches)
        load_s[name] = time.perf_counter() - started
    low, high = (int(x) for x in args.context.split(","))
    rng = random.Random(args.seed)
    lengths = [rng.randint(low, high) for _ in range(args.batch)]
    first = [rng.randrange(3, engines[next(iter(engines))].vocab) for _ in range(args.batch)]
    running: dict[str, list[Sequence]] = {}
    for name in engines:
        running[name] = []
        for slot, (length, token) in enumerate(zip(lengths, first, strict=True)):
            seq = Sequence([1] * length, SamplingParams(), lambda _: None, lambda: False)
            seq.slot, seq.prefilled, seq.generated = slot, length, [token]
            # What admission reserves (prompt + max_tokens): the KV cache grows up to it.
            seq.reserved = length + args.steps + 4
            running[name].append(seq)

    def step(name: str) -> float:
        seqs = running[name]
        tokens = [[s.generated[-1]] for s in seqs]
        starts = [len(s.prompt) + len(s.generated) - 1 for s in seqs]
        clock = time.process_time if args.cpu_time else time.perf_counter
        began = clock()
        logits = engines[name]._forward(seqs, tokens, starts)
        chosen = torch.argmax(logits[:, -1], dim=-1).tolist()
        took = clock() - began
        for seq, token in zip(seqs, chosen, strict=True):
            seq.generated.append(int(token))
        return took

    # The engines' threads sleep while they have nothing to run: drive the passes from here,
    # alternating between variants so that both see the same machine load.
    times: dict[str, list[float]] = {name: [] for name in engines}
    with torch.inference_mode():
        for index in range(args.steps + 3):
            for name in engines:
                took = step(name)
                if index >= 3:
                    times[name].append(took)
        if args.profile:
            from torch.profiler import ProfilerActivity, profile

            for name in engines:
                with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                    for _ in range(3):
                        step(name)
                print(f"{name}: 3 decode passes")
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
    same = len({tuple(s.generated[-1] for s in seqs) for seqs in running.values()}) == 1
    report: dict[str, object] = {
        "size": args.size,
        "batch": args.batch,
        "context": args.context,
        "threads": torch.get_num_threads(),
        "same_tokens": same,
    }
    for name, engine in engines.items():
        engine.close()
        median_ms = statistics.median(times[name]) * 1000
        print(
            f"{name}: size {args.size} batch {args.batch} context {args.context}: decode step "
            f"median {median_ms:.1f} ms, min {min(times[name]) * 1000:.1f} ms over "
            f"{len(times[name])} steps ({args.batch / statistics.median(times[name]):.1f} "
            f"tok/s); engine load {load_s[name]:.1f} s; threads {torch.get_num_threads()}; "
            f"{engine.dtype}, {engine.packed_linears} packed linears, {engine.fused_mlps} fused "
            f"MLPs, row attention {engine.row_attention}"
        )
        report[name] = {
            "step_ms_median": median_ms,
            "step_ms_all": [t * 1000 for t in times[name]],
            "load_s": load_s[name],
            "dtype": str(engine.dtype),
            "packed_linears": engine.packed_linears,
            "fused_mlps": engine.fused_mlps,
            "row_attention": engine.row_attention,
        }
    if len(engines) > 1:
        print(f"same greedy tokens in every variant: {same}")
    out = Path(__file__).resolve().parent.parent / "results" / f"llm-step-{args.size}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
