"""Resident memory of the default LLM engine (issue 39), its process and the processes it starts
(the openvino engine's worker): after load, and while serving
`--concurrency` chats of `--prompt-tokens` + `--output-tokens` tokens, for a model folder with
the default keys (model.json names only the model, unless --dtype or --set add keys).

    python bench/llm_memory.py [--size 100m] [--concurrency 32] [--prompt-tokens 512]
                               [--output-tokens 128] [--dtype float32] [--set key=json ...]

Prints one JSON line, also written to bench/results/llm-memory-<timestamp>.json: RSS
(VmRSS) after load, its peak while serving (sampled after every engine step, and VmHWM), the
KV pool's peak bytes where the engine reports them, the weights' bytes, the KV budget, and the
run's time. Uses only the engine's public face, so that it runs against an older checkout too
(PYTHONPATH=<that checkout>)."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import benchlib


def tree_kib(field: str) -> int:
    """`field` of this process plus its descendants' (the openvino engine's worker)."""
    return benchlib.tree_kib(os.getpid(), field)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="100m")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--dtype", help="model.json dtype (default: none, i.e. auto)")
    parser.add_argument("--set", action="append", default=[], help="model.json key=json")
    args = parser.parse_args()

    from oceanus.backends.llm.args import read_engine_args
    from oceanus.backends.llm.backend import make_engine
    from oceanus.backends.llm.sampling import SamplingParams
    from oceanus.backends.llm.scheduler import StepOutput
    from oceanus.examples.llm import cached_llm

    folder = cached_llm(args.size)
    keys: dict[str, Any] = {"model": str(folder)}
    if args.dtype:
        keys["dtype"] = args.dtype
    for item in args.set:
        key, _, value = item.partition("=")
        keys[key] = json.loads(value)
    with tempfile.TemporaryDirectory() as version:
        (Path(version) / "model.json").write_text(json.dumps(keys))
        engine_args = read_engine_args(Path(version), "llm")
    rss_before = tree_kib("VmRSS")
    started = time.monotonic()
    engine = make_engine(engine_args, threads=None)
    load_s = time.monotonic() - started
    time.sleep(0.5)
    rss_load = tree_kib("VmRSS")
    peak = [rss_load, 0]

    def step(e: Any) -> None:
        peak[0] = max(peak[0], tree_kib("VmRSS"))
        peak[1] = max(peak[1], getattr(getattr(e, "cache", None), "allocated_bytes", 0))

    engine.on_step = step
    text = " ".join(["The ocean covers most of the planet, and its tides rise twice a day."] * 200)
    ids = engine.encode(text)
    done = threading.Semaphore(0)
    tokens = [0]

    def sink(out: StepOutput) -> None:
        tokens[0] += len(out.token_ids)
        if out.finished:
            done.release()

    params = SamplingParams(max_tokens=args.output_tokens, temperature=0.0, ignore_eos=True)
    started = time.monotonic()
    for index in range(args.concurrency):
        prompt = ids[index : index + args.prompt_tokens]  # a different prompt per chat
        engine.submit(prompt, params, sink)
    for _ in range(args.concurrency):
        assert done.acquire(timeout=3600)
    serve_s = time.monotonic() - started
    rss_after = tree_kib("VmRSS")
    hwm = tree_kib("VmHWM")
    engine.close()
    mib = 1024
    report = {
        "size": args.size,
        "model_json": {k: v for k, v in keys.items() if k != "model"},
        "engine": f"{engine_args.engine} ({engine_args.engine_source})",
        "dtype": engine_args.dtype,
        "concurrency": args.concurrency,
        "prompt_tokens": args.prompt_tokens,
        "output_tokens": args.output_tokens,
        "output_tokens_made": tokens[0],
        "rss_before_load_mib": round(rss_before / mib),
        "rss_after_load_mib": round(rss_load / mib),
        "rss_peak_serving_mib": round(peak[0] / mib),
        "vmhwm_mib": round(hwm / mib),  # summed per process: an upper bound
        "rss_after_serving_mib": round(rss_after / mib),
        "kv_pool_peak_mib": round(peak[1] / 2**20) if peak[1] else None,
        "weights_mib": round(getattr(engine, "weights_bytes", 0) / 2**20) or None,
        "memory": getattr(engine, "describe_memory", lambda: None)(),
        "load_s": round(load_s, 1),
        "serve_s": round(serve_s, 1),
    }
    print(json.dumps(report))
    benchlib.write_results("llm-memory", report, indent=None)


if __name__ == "__main__":
    main()
