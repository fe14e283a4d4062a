"""Weight memory and decode speed of the default LLM engine by weight format (issue 39):
float32, bfloat16, `quantization: "int8"` under each, and a Q8_0 GGUF file (made here from the
same model by oceanus/examples/gguf_writer.py) dequantized and kept int8.

    python bench/llm_gguf.py [--size 100m] [--streams 1 8] [--tokens 64] [--threads 1]

For each row: the engine's weight bytes (parameters, int8 weights and scales), RSS after load,
and decode tokens/s for N greedy streams of `--tokens` tokens after a short prompt (median of
`--repeats` runs). Prints a Markdown table."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import benchlib


def rss_mib() -> float:
    return benchlib.status_kib("self", "VmRSS") / 1024


def decode_rate(engine: Any, streams: int, tokens: int) -> float:
    from oceanus.backends.llm.sampling import SamplingParams

    prompt = engine.encode("The ocean covers most of the planet and")
    done = threading.Semaphore(0)

    def take(out: Any) -> None:
        if out.finished:
            done.release()

    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    for _ in range(streams):
        engine.submit(prompt, params, take)
    for _ in range(streams):
        assert done.acquire(timeout=600)
    return streams * tokens / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="100m")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--row", help="run this row only, without the header (internal)")
    parser.add_argument("--gguf", help="the Q8_0 file (internal)")
    args = parser.parse_args()

    from oceanus.backends.llm.args import read_engine_args
    from oceanus.backends.llm.engine import Engine
    from oceanus.examples.gguf_writer import write_gguf
    from oceanus.examples.llm import cached_llm

    folder = cached_llm(args.size)
    work = Path(tempfile.mkdtemp(prefix="llm-gguf-bench-"))
    gguf = (
        Path(args.gguf)
        if args.gguf
        else write_gguf(folder, work / f"{args.size}-Q8_0.gguf", "Q8_0")
    )
    rows: list[tuple[str, dict[str, Any]]] = [
        ("float32", {"model": str(folder), "dtype": "float32"}),
        ("bfloat16", {"model": str(folder), "dtype": "bfloat16"}),
        (
            "int8, float32 compute",
            {"model": str(folder), "dtype": "float32", "quantization": "int8"},
        ),
        (
            "int8, bfloat16 compute",
            {"model": str(folder), "dtype": "bfloat16", "quantization": "int8"},
        ),
        ("Q8_0 GGUF, float32", {"model": str(gguf), "dtype": "float32"}),
        ("Q8_0 GGUF, int8", {"model": str(gguf), "dtype": "float32", "quantization": "int8"}),
    ]
    if args.row is None:  # each row in a process of its own: RSS is that row's alone
        head = "| weights | model.json | weight MiB | RSS after load MiB | " + " | ".join(
            f"decode tok/s, {n} stream{'s' if n > 1 else ''}" for n in args.streams
        )
        print(head + " |")
        print("|" + "---|" * (4 + len(args.streams)), flush=True)
        for name, _ in rows:
            argv = [sys.executable, __file__, "--row", name, "--gguf", str(gguf)]
            argv += ["--size", args.size, "--tokens", str(args.tokens)]
            argv += ["--threads", str(args.threads), "--repeats", str(args.repeats)]
            argv += ["--streams", *map(str, args.streams)]
            subprocess.run(argv, check=True)
        return
    for name, keys in [row for row in rows if row[0] == args.row]:
        version = work / name.replace(" ", "_").replace(",", "") / "1"
        version.mkdir(parents=True)
        keys = {**keys, "num_threads": args.threads, "max_model_len": 512, "max_num_seqs": 16}
        (version / "model.json").write_text(json.dumps(keys))
        engine = Engine(read_engine_args(version, "bench"))
        try:
            rss = rss_mib()
            decode_rate(engine, 1, 8)  # warm up
            rates = [
                statistics.median(decode_rate(engine, n, args.tokens) for _ in range(args.repeats))
                for n in args.streams
            ]
        finally:
            engine.close()
        shown = {k: v for k, v in keys.items() if k in ("dtype", "quantization")}
        cells = " | ".join(f"{r:.1f}" for r in rates)
        print(
            f"| {name} | `{json.dumps(shown)}` | {engine.weights_bytes / 2**20:.1f} | "
            f"{rss:.0f} | {cells} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
