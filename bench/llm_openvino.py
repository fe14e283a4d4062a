"""OpenVINO GenAI's continuous-batching pipeline in process (issue 25's target (d)), run by
bench/llm.py in a separate interpreter (`--openvino-python`): openvino-genai and optimum-intel
pin their own transformers/openvino versions, so they live in their own virtual environment.

Converts the Hugging Face folder once to OpenVINO IR with optimum-intel (model and tokenizer,
offline, cached in --ir-dir), then for each concurrency level keeps that many requests in the
pipeline (a new one joins when one ends, one step loop on this thread), greedy, EOS ignored,
the same prompt token ids and output lengths as the other targets. Prints one JSON line:
{"<c>": {"samples": [[ttft_s, e2e_s, tokens, warm, start_s], ...], "wall_s": ...,
"max_cache_usage_pct": ...}, "versions": {...}, "precision": {...}} (warm: 1 for a client's
first request under --warmup, start_s: when it was sent).

Precisions: --precision is the CPU plugin's INFERENCE_PRECISION_HINT (the matmuls), and
--kv-precision its KV_CACHE_PRECISION (the paged KV cache); both default to f32, the work our
fp32 engine does; `default` passes nothing and lets the plugin choose (bf16 compute on a CPU
with AVX512-BF16 or AMX). The KV cache precision matters at c32: with contexts of up to ~770
tokens a decode step reads as much KV cache as weights. Left to itself the plugin did NOT keep
it in f32, even under an f32 hint: its 2 GB cache then peaked at half the fill of an explicit
f32 KV cache (16 bits a value), an explicit u8 at ~40 % (max_cache_usage_pct, docs/llm.md).

    python bench/llm_openvino.py --model DIR --ir-dir DIR --jobs FILE.json
                                 [--max-num-seqs 32] [--max-num-batched-tokens 512]
                                 [--precision f32|bf16|f16|default]
                                 [--kv-precision f32|bf16|f16|u8|default]
                                 [--stagger-ms 0] [--warmup]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def convert(model: Path, ir_dir: Path) -> None:
    """optimum-intel's exporter (fp32 weights: our engine runs fp32) and openvino-tokenizers."""
    if (ir_dir / "openvino_model.xml").exists() and (ir_dir / "openvino_tokenizer.xml").exists():
        return
    cli = Path(sys.executable).with_name("optimum-cli")
    argv = [str(cli), "export", "openvino", "--model", str(model)]
    argv += ["--task", "text-generation-with-past", "--weight-format", "fp32", str(ir_dir)]
    subprocess.run(argv, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def run_level(
    pipe: Any,
    ov: Any,
    genai: Any,
    jobs: list[dict[str, Any]],
    concurrency: int,
    stagger_s: float,
    warmup: bool = False,
) -> Any:
    import numpy as np

    pending = list(reversed(jobs))
    live: dict[int, tuple[Any, float, list[float], int]] = {}
    usage = 0.0  # the KV cache's peak fill (% of its fixed size): its bytes per token
    warm: set[int] = set()  # each client's first request
    samples: list[list[float]] = []
    began = time.perf_counter()
    next_id = 0
    started = 0

    def add() -> None:
        nonlocal next_id, started
        job = pending.pop()
        config = genai.GenerationConfig()
        config.max_new_tokens = job["tokens"]
        config.min_new_tokens = job["tokens"]
        config.ignore_eos = True
        config.do_sample = False
        ids = ov.Tensor(np.array([job["prompt_ids"]], dtype=np.int64))
        handle = pipe.add_request(next_id, ids, config)
        live[next_id] = (handle, time.perf_counter(), [0.0], 0)
        if warmup and started < concurrency:
            warm.add(next_id)
        next_id += 1
        started += 1

    while pending or live:
        now = time.perf_counter()
        # Staggered arrivals: client i joins i * stagger_s after the start.
        while pending and started < concurrency and now - began >= started * stagger_s:
            add()
        if not live:
            time.sleep(min(stagger_s, 0.001))
            continue
        pipe.step()
        now = time.perf_counter()
        usage = max(usage, pipe.get_metrics().cache_usage)
        for rid in list(live):
            handle, start, first, count = live[rid]
            got = 0
            if handle.can_read():
                for out in handle.read().values():
                    got += len(out.generated_ids)
            if got and not first[0]:
                first[0] = now
            count += got
            live[rid] = (handle, start, first, count)
            status = handle.get_status()
            if status != genai.GenerationStatus.RUNNING and not handle.can_read():
                flag = 1 if rid in warm else 0
                samples.append([(first[0] or now) - start, now - start, count, flag, start - began])
                del live[rid]
                if pending and started >= concurrency:
                    add()  # closed loop: the client sends its next request
    wall = time.perf_counter() - began
    return {"samples": samples, "wall_s": wall, "max_cache_usage_pct": usage}


def plugin_properties(precision: str, kv_precision: str) -> dict[str, str]:
    """The CPU plugin's properties for the pipeline (it compiles the model with them; the KV
    cache's element type is then the compiled model's `key_cache.N` input type)."""
    properties = {}
    if precision != "default":
        properties["INFERENCE_PRECISION_HINT"] = precision
    if kv_precision != "default":
        properties["KV_CACHE_PRECISION"] = kv_precision
    return properties


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--ir-dir", type=Path, required=True)
    parser.add_argument("--jobs", type=Path, required=True)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--precision", default="f32", choices=["f32", "bf16", "f16", "default"])
    parser.add_argument(
        "--kv-precision", default="f32", choices=["f32", "bf16", "f16", "u8", "default"]
    )
    parser.add_argument("--stagger-ms", type=float, default=0.0)
    parser.add_argument("--warmup", action="store_true", help="each client's first is apart")
    args = parser.parse_args()
    convert(args.model, args.ir_dir)

    import openvino as ov
    import openvino_genai as genai

    scheduler = genai.SchedulerConfig()
    scheduler.max_num_seqs = args.max_num_seqs
    scheduler.max_num_batched_tokens = args.max_num_batched_tokens
    scheduler.dynamic_split_fuse = True  # chunked prefill, as ours
    scheduler.cache_size = 2  # GB of KV cache
    properties = plugin_properties(args.precision, args.kv_precision)
    pipe = genai.ContinuousBatchingPipeline(str(args.ir_dir), scheduler, "CPU", properties)
    levels: dict[str, list[dict[str, Any]]] = json.loads(args.jobs.read_text())
    first = next(iter(levels.values()))
    run_level(pipe, ov, genai, first[:1], 1, 0.0)  # warm-up
    stagger = args.stagger_ms / 1000
    results: dict[str, Any] = {
        c: run_level(pipe, ov, genai, jobs, int(c), stagger, args.warmup)
        for c, jobs in levels.items()
    }
    results["versions"] = {"openvino": ov.__version__, "openvino_genai": genai.__version__}
    core = ov.Core()
    results["precision"] = {
        "inference": args.precision,
        "kv_cache": args.kv_precision,
        "plugin_defaults": {
            key: str(core.get_property("CPU", key))
            for key in ("INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION")
        },
    }
    print(json.dumps(results))


if __name__ == "__main__":
    main()
