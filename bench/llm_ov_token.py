"""The openvino engine's time per output token at c=1 (issue 39: within 2x of the weight-bandwidth
limit for the engine's weight precision), in process, greedy, one request at a time.

The limit is the bytes one decode step must read, every weight but the input embedding's table
(one row of it is read) plus the KV cache at the mean context, over this machine's measured read
bandwidth (bench/membw.py, taken in the same run), on as many threads as the engine computes
with. The weights' bytes are the precision's: the traced model's parameter count x 2 for bf16
(the CPU plugin converts the fp32 IR's weights at compile), the compressed IR's bytes for
int8/int4 (weights plus their scales). The worker's CPU time per token is read from /proc.

    python bench/llm_ov_token.py [--size 100m] [--variants bf16,int8,int4] [--tokens 64]
                                 [--rounds 5]

Prints a table and writes bench/results/llm_ov_token-<timestamp>.json."""

from __future__ import annotations

import argparse
import os
import statistics
import threading
from typing import Any

import benchlib
from membw import read_bandwidth

PROMPT = "The tide comes in twice a day, and the harbour master writes down every high water."


def one_request(engine: Any, tokens: int) -> tuple[float, float]:
    """The median gap between tokens (ms) and the worker's CPU ms per token."""
    from oceanus.backends.llm.sampling import SamplingParams

    done = threading.Event()

    def sink(out: Any) -> None:
        if out.finished:
            done.set()

    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    cpu_before = benchlib.cpu_seconds(engine._process.pid)
    seq = engine.submit(engine.encode(PROMPT), params, sink)
    done.wait()
    cpu_ms = (benchlib.cpu_seconds(engine._process.pid) - cpu_before) * 1e3 / max(1, tokens)
    return statistics.median(seq.token_gaps_ns) / 1e6, cpu_ms


def read_bytes(engine: Any, config: Any, variant: str, context: int) -> tuple[int, int]:
    """Weight and KV bytes one decode step reads."""
    embedding = int(config.vocab_size) * int(config.hidden_size)
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    kv = 2 * int(config.num_hidden_layers) * kv_heads * head_dim * 2 * context  # bf16 cache
    if variant == "bf16":
        return (engine.weights_bytes // 4 - embedding) * 2, kv
    # Compressed: the IR's bytes less the embedding's (NNCF keeps the input table int8 too).
    return engine.weights_bytes - embedding, kv


def measure(args: argparse.Namespace, variant: str, bandwidth: Any) -> dict[str, Any]:
    from transformers import AutoConfig

    from oceanus.backends.llm.args import EngineArgs
    from oceanus.backends.llm.openvino_engine import OpenVinoEngine
    from oceanus.examples.llm import cached_llm

    folder = cached_llm(args.size)
    quantization = None if variant == "bf16" else variant
    engine_args = EngineArgs(
        model=folder,
        tokenizer=folder,
        dtype="bfloat16",
        max_model_len=1024,
        engine="openvino",
        quantization=quantization,
    )
    engine = OpenVinoEngine(engine_args, threads=args.threads or None)
    try:
        one_request(engine, 8)  # warm-up
        gaps, cpus = [], []
        for index in range(args.rounds):
            gap, cpu = one_request(engine, args.tokens)
            gaps.append(gap)
            cpus.append(cpu)
            print(
                f"{variant} round {index}: {gap:.2f} ms/token, worker CPU {cpu:.2f} ms", flush=True
            )
        context = len(engine.encode(PROMPT)) + args.tokens // 2
        weights, kv = read_bytes(engine, AutoConfig.from_pretrained(folder), variant, context)
    finally:
        engine.close()
    limit_ms = (weights + kv) / bandwidth.bytes_per_s * 1e3
    cpu_limit_ms = (weights + kv) / bandwidth.bytes_per_cpu_s * 1e3
    gap, cpu = statistics.median(gaps), statistics.median(cpus)
    return {
        "variant": variant,
        "gaps_ms": gaps,
        "worker_cpu_ms": cpus,
        "gap_ms": gap,
        "tok_s": 1e3 / gap,
        "weight_bytes": weights,
        "kv_bytes": kv,
        "limit_ms": limit_ms,
        "gap_over_limit": gap / limit_ms,
        "cpu_limit_ms": cpu_limit_ms,
        "cpu_over_cpu_limit": cpu / cpu_limit_ms,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="100m")
    parser.add_argument("--variants", default="bf16,int8,int4")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="OpenVINO threads (0: all)")
    args = parser.parse_args()
    load_before = benchlib.loadavg()
    import torch

    threads = args.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)  # the bandwidth on as many threads as OpenVINO computes with
    bandwidth = read_bandwidth()
    print(
        f"read bandwidth {bandwidth.bytes_per_s / 1e9:.1f} GB/s on {threads} threads, "
        f"{bandwidth.bytes_per_cpu_s / 1e9:.1f} GB per CPU-second",
        flush=True,
    )
    results = [measure(args, v, bandwidth) for v in args.variants.split(",")]
    print(
        f"{'weights':8} {'ms/token':>9} {'tok/s':>7} {'MB read':>8} {'limit ms':>9} "
        f"{'x limit':>8} {'CPU ms':>7} {'x CPU limit':>12}"
    )
    for r in results:
        print(
            f"{r['variant']:8} {r['gap_ms']:9.2f} {r['tok_s']:7.1f} "
            f"{(r['weight_bytes'] + r['kv_bytes']) / 1e6:8.0f} {r['limit_ms']:9.2f} "
            f"{r['gap_over_limit']:7.2f}x {statistics.median(r['worker_cpu_ms']):7.2f} "
            f"{r['cpu_over_cpu_limit']:11.2f}x"
        )
    print(f"load average before {load_before}, after {benchlib.loadavg()}")
    document = {
        "size": args.size,
        "tokens": args.tokens,
        "rounds": args.rounds,
        "threads": threads,
        "bandwidth": bandwidth.__dict__,
        "loadavg_before": load_before,
        "loadavg_after": benchlib.loadavg(),
        "results": results,
    }
    benchlib.write_results("llm_ov_token", document)


if __name__ == "__main__":
    main()
