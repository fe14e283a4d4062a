"""Language-model serving (issue 25): output tokens/s, time to first token and time per output
token (p50, p99) at several concurrencies, the generated ~100 M-parameter Llama model, against
the baselines the issue names, all measured in one run so that their ratios hold on a noisy,
shared machine:

  oceanus   the server (`generate_stream`, SSE), our continuous-batching engine
  inproc    the same engine in process, no server (the limit)
  oceanus+ov, inproc+ov   the same with model.json's `engine: "openvino"` (OpenVINO GenAI's
            pipeline in the engine's own process, behind our scheduler)
  hf_cb     transformers' own continuous batching (`generate_batch`, paged attention) in process
  naive     FastAPI calling transformers' `generate` per request (bench/llm_naive_server.py)
  serve     `transformers serve --continuous-batching` (its OpenAI API, /v1/completions stream)
  openvino  OpenVINO GenAI's ContinuousBatchingPipeline in process (bench/llm_openvino.py), run
            by another interpreter (--openvino-python: a venv with openvino-genai and
            optimum-intel, kept out of the project's environment); skipped without it

A target may name its precisions after a colon, so that one run compares equal work:
`oceanus:bf16` / `inproc:bf16` load the model with model.json's `dtype: "bfloat16"` (weights,
matmuls and KV cache in bf16; plain `oceanus` is fp32 throughout), `oceanus:fp32/bf16` keeps
fp32 matmuls over a bf16 KV cache (`kv_cache_dtype`); `openvino:COMPUTE/KV` sets
the CPU plugin's inference precision and KV-cache precision (f32, bf16, f16, u8; plain
`openvino` is f32/f32, our fp32 engine's work), `openvino:default` leaves both to the plugin.
Every row of the table and every result in the JSON says which precisions it ran at.

Each of `concurrency` clients sends `--requests` requests one after the other; prompts and
output lengths are drawn once (fixed seed) from the given ranges and shared by every target.
Outputs ignore EOS where the target allows it, so every target writes the same token counts.
The naive server does not stream: its time to first token is its whole latency.

    python bench/llm.py [--size 100m] [--concurrency 1,8,32] [--prompt-tokens 32,512]
                        [--output-tokens 64,256] [--requests 1] [--targets oceanus,inproc,...]
                        [--max-num-batched-tokens 512] [--stagger-ms 0] [--warmup]
                        [--min-requests 0] [--repeats 1]
                        [--openvino-python VENV/bin/python] [--openvino-ir-dir DIR]
    e.g. --targets oceanus,openvino,oceanus:bf16,openvino:bf16/bf16

--stagger-ms 0 (the default) starts every client at once: a burst of `c` prompts, whose time
to first token is bound by prefilling all of them; with N > 0 client i starts i*N ms late.
--warmup counts each client's first request as its warm-up: the figures of those (`burst`) and
of the rest (`steady`: the closed loop in steady state, each client sending its next request
when one ends, as genai-perf and perf_analyzer measure a concurrency) are reported apart, beside
the figures over all. Use it with --requests >= 2 (--min-requests gives c=1 enough samples).
--repeats N runs every point N times, the targets alternating, and reports medians (every run
in the JSON's `runs`).

Prints a table and writes bench/results/llm-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import benchlib
from llm_inproc import (
    Job,
    Sample,
    make_jobs,
    median_result,
    run_hf_cb,
    run_inproc,
    run_openvino,
    summarize,
)

# llm_openai.py (issue 26's bench) starts its servers through these.
from llm_servers import process as process
from llm_servers import server_argv as server_argv
from llm_targets import engine_args, parts, precision

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ("oceanus", "inproc", "hf_cb", "naive", "serve", "openvino")
# ---- over HTTP --------------------------------------------------------------------------------


async def _one_sse(session: Any, url: str, body: dict[str, Any], parse: Any) -> Sample:
    began = time.perf_counter()
    first = 0.0
    tokens = 0
    first_tokens = 1
    async with session.post(url, json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"{url}: {response.status} {await response.text()}")
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            got = parse(event)
            if got and not first:
                first = time.perf_counter()
                first_tokens = got
            tokens += got
            # An OpenAI stream's last chunk counts the tokens (stream_options.include_usage).
            usage = event.get("usage")
            if usage:
                tokens = int(usage["completion_tokens"])
    end = time.perf_counter()
    return Sample((first or end) - began, end - began, tokens, first_tokens=first_tokens)


async def _one_json(session: Any, url: str, body: dict[str, Any]) -> Sample:
    began = time.perf_counter()
    async with session.post(url, json=body) as response:
        data = await response.json()
    end = time.perf_counter()
    return Sample(end - began, end - began, int(data["tokens"]))


async def run_http(
    target: str,
    url: str,
    model: str,
    jobs: list[Job],
    concurrency: int,
    stagger_s: float = 0.0,
    warmup: bool = False,
) -> dict[str, Any]:
    import aiohttp

    queue = list(reversed(jobs))
    samples: list[Sample] = []

    def request(session: Any, job: Job) -> Any:
        if target == "oceanus":
            body = {
                "text_input": job.prompt,
                "stream": True,
                "sampling_parameters": json.dumps(
                    {"max_tokens": job.tokens, "temperature": 0, "ignore_eos": True}
                ),
                "return_num_output_tokens": True,
            }
            return _one_sse(
                session,
                f"{url}/v2/models/{model}/generate_stream",
                body,
                lambda event: int(event.get("num_output_tokens", 0)),
            )
        if target == "serve":
            body = {
                "model": model,
                "prompt": job.prompt,
                "max_tokens": job.tokens,
                "stream": True,
                "temperature": 0,
            }

            def tokens(event: dict[str, Any]) -> int:
                choices = event.get("choices") or []
                return 1 if choices and choices[0].get("text") else 0

            return _one_sse(session, f"{url}/v1/completions", body, tokens)
        return _one_json(
            session, f"{url}/generate", {"text_input": job.prompt, "max_tokens": job.tokens}
        )

    async def client(session: Any, index: int) -> None:
        await asyncio.sleep(index * stagger_s)
        warm = warmup
        while queue:
            sent = time.perf_counter()
            sample = await request(session, queue.pop())
            sample.warm, sample.start_s, warm = warm, sent - began, False
            samples.append(sample)

    timeout = aiohttp.ClientTimeout(total=3600)
    # One connection per client at most (aiohttp's default pool of 100 would not limit c32;
    # a larger c needs the pool to grow with it).
    connector = aiohttp.TCPConnector(limit=max(100, concurrency))
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        began = time.perf_counter()
        await asyncio.gather(*(client(session, i) for i in range(concurrency)))
        wall = time.perf_counter() - began
    return summarize(samples, wall)


Runner = Callable[[int], dict[int, dict[str, Any]]]


def open_targets(
    stack: contextlib.ExitStack,
    args: argparse.Namespace,
    targets: list[str],
    folder: Path,
    repo: Path,
    log_dir: Path,
    jobs: dict[int, list[Job]],
    results: dict[str, dict[str, Any]],
) -> dict[str, Runner]:
    """Start every target (engines loaded, servers up, each warmed by one request) and return,
    per target, what measures it at one concurrency: all stay up until the stack closes, so
    that repeats can alternate between them."""
    import torch

    from oceanus.backends.llm.args import EngineArgs
    from oceanus.backends.llm.backend import make_engine
    from oceanus.examples.llm import write_llm_model

    stagger = args.stagger_ms / 1000
    sizes: dict[str, object] = {
        "max_model_len": args.max_len,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
    }
    warmup = args.warmup
    first = next(iter(jobs.values()))[:1]
    runners: dict[str, Runner] = {}
    for target in targets:
        if parts(target)[0] != "inproc":
            continue
        given = engine_args(target)
        made = EngineArgs(
            model=folder,
            tokenizer=folder,
            dtype=given["dtype"],
            kv_cache_dtype=given["kv_cache_dtype"],
            max_model_len=args.max_len,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            engine=given["engine"],
        )
        engine = make_engine(made, threads=torch.get_num_threads())
        stack.callback(engine.close)
        run_inproc(engine, first, 1)

        def inproc(c: int, engine: Any = engine) -> dict[int, dict[str, Any]]:
            return {c: run_inproc(engine, jobs[c], c, stagger, warmup)}

        runners[target] = inproc
    if "hf_cb" in targets:
        from transformers import AutoModelForCausalLM, GenerationConfig

        model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="paged|sdpa")
        config = GenerationConfig(
            max_new_tokens=args.max_new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0
        )
        manager = model.eval().init_continuous_batching(generation_config=config)
        manager.start()
        stack.callback(lambda: manager.stop(block=True))
        run_hf_cb(manager, first, 1)
        runners["hf_cb"] = lambda c: {c: run_hf_cb(manager, jobs[c], c)}
    ir_dir = Path(args.openvino_ir_dir or folder.parent / f"{args.size}-openvino")
    limits = [args.max_num_seqs, args.max_num_batched_tokens]
    for target in targets:
        if target.partition(":")[0] != "openvino":
            continue
        if not args.openvino_python:
            results[target]["error"] = "skipped: no --openvino-python"
            continue
        wanted = precision(target)

        def openvino(c: int, wanted: dict[str, str] = wanted) -> dict[int, dict[str, Any]]:
            # A process per call (it loads the converted model again, a few seconds).
            got = run_openvino(
                args.openvino_python,
                folder,
                ir_dir,
                {c: jobs[c]},
                limits,
                args.stagger_ms,
                warmup,
                (wanted["compute"], wanted["kv_cache"]),
            )
            return {int(level): result for level, result in got.items()}

        runners[target] = openvino
    for target in targets:
        base = parts(target)[0]
        if base not in ("oceanus", "naive", "serve"):
            continue
        port = benchlib.free_port()
        # Each oceanus variant has its own repository (model.json's engine, dtype) and server.
        served = repo / target.replace("/", "-").replace(":", "-")
        if base == "oceanus":
            folder_args: dict[str, object] = {**sizes, **engine_args(target)}
            write_llm_model(served, "llm", size=args.size, engine_args=folder_args)
        argv, health = server_argv(base, folder, served, port)
        try:
            log = log_dir / f"{target.replace('/', '-')}.log"
            url = stack.enter_context(process(argv, port, health, log))
        except Exception as exc:  # a baseline that does not run here is reported, not fatal
            results[target]["error"] = str(exc)[-500:]
            print(f"{target}: failed: {str(exc)[-300:]}", flush=True)
            continue
        name = "llm" if base == "oceanus" else str(folder)
        asyncio.run(run_http(base, url, name, first, 1))

        def http(c: int, base: str = base, url: str = url, name: str = name) -> Any:
            return {c: asyncio.run(run_http(base, url, name, jobs[c], c, stagger, warmup))}

        runners[target] = http
    return runners


def add_workload_args(parser: argparse.ArgumentParser) -> None:
    """The model and the load, as every LLM bench names them (llm_openai.py too)."""
    parser.add_argument("--size", default="100m")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--prompt-tokens", default="32,512")
    parser.add_argument("--output-tokens", default="64,256")
    parser.add_argument("--requests", type=int, default=1, help="per client")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_workload_args(parser)
    parser.add_argument(
        "--min-requests", type=int, default=0, help="at least this many at each level"
    )
    parser.add_argument(
        "--warmup",
        action="store_true",
        help="each client's first request is a warm-up: its figures are reported apart "
        "(`burst`) from the rest (`steady`, the closed loop in steady state)",
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="runs of every point, targets alternated; medians"
    )
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=512, help="prefill tokens per step"
    )
    parser.add_argument("--openvino-python", help="interpreter for the openvino target")
    parser.add_argument(
        "--openvino-ir-dir", help="where the converted model is cached (default: beside it)"
    )
    parser.add_argument(
        "--stagger-ms",
        type=float,
        default=0.0,
        help="client i starts i times this late (0: all clients start at once, a burst)",
    )
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    low, high = (int(x) for x in args.prompt_tokens.split(","))
    prompt = (low, high)
    low, high = (int(x) for x in args.output_tokens.split(","))
    output = (low, high)
    targets = args.targets.split(",")
    precisions = {target: precision(target) for target in targets}
    load_before = benchlib.loadavg()

    from transformers import AutoTokenizer

    from oceanus.examples.llm import cached_llm

    folder = cached_llm(args.size)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    max_len = prompt[1] + output[1] + 8
    args.max_len, args.max_new_tokens = max_len, output[1]
    jobs = {
        c: make_jobs(tokenizer, max(c * args.requests, args.min_requests), prompt, output)
        for c in levels
    }
    results: dict[str, dict[str, Any]] = {t: {} for t in targets}
    log_dir = Path(tempfile.mkdtemp(prefix="bench-llm-"))
    repo = log_dir / "repo"

    runs: dict[str, dict[str, list[dict[str, Any]]]] = {t: {} for t in targets}

    def point(target: str, c: int, result: dict[str, Any]) -> None:
        runs[target].setdefault(str(c), []).append(result)
        brief: dict[str, Any] = {
            k: round(v, 2) for k, v in result.items() if isinstance(v, float | int)
        }
        for phase in ("burst", "steady"):
            if phase in result:
                brief[phase] = {k: round(v, 1) for k, v in result[phase].items()}
        print(f"{target:8s} c={c:<3d} {json.dumps(brief)}", flush=True)

    with contextlib.ExitStack() as stack:
        runners = open_targets(stack, args, targets, folder, repo, log_dir, jobs, results)
        # Every repeat runs each level on every target, the targets' order rotated each time,
        # so that a change in the machine's load falls on all of them alike.
        for repeat in range(args.repeats):
            order = list(runners)[repeat % max(len(runners), 1) :]
            order += list(runners)[: repeat % max(len(runners), 1)]
            for c in levels:
                for target in order:
                    try:
                        for at, result in runners[target](c).items():
                            point(target, at, result)
                    except Exception as exc:  # reported, not fatal
                        results[target]["error"] = str(exc)[-1500:]
                        print(f"{target}: failed: {str(exc)[-1500:]}", flush=True)
    for target, levels_run in runs.items():
        for level, got in levels_run.items():
            results[target][level] = median_result(got)
            if len(got) > 1:
                results[target][level]["runs"] = got

    rows = []
    for target in targets:
        for c in levels:
            r = results[target].get(str(c))
            if r is None:
                continue
            for phase, figures in (("all", r), ("steady", r.get("steady"))):
                if figures is None:
                    continue
                rows.append(
                    [
                        target,
                        "{compute}/{kv_cache}".format(**precisions[target]),
                        c,
                        phase,
                        benchlib.fmt_num(figures["tokens_per_s"]),
                        benchlib.fmt_num(figures.get("ttft_p50_ms")),
                        benchlib.fmt_num(figures.get("ttft_p99_ms")),
                        benchlib.fmt_num(figures.get("tpot_p50_ms")),
                        benchlib.fmt_num(figures.get("tpot_p99_ms")),
                    ]
                )
    print(
        benchlib.table(
            [
                "target",
                "compute/KV",
                "c",
                "requests",
                "tok/s",
                "TTFT p50 ms",
                "TTFT p99 ms",
                "TPOT p50 ms",
                "TPOT p99 ms",
            ],
            rows,
        )
    )
    ratios = {}
    for ours in (t for t in targets if parts(t)[0] in ("oceanus", "inproc")):
        for other in (t for t in targets if parts(t)[0] != "oceanus"):
            for c in levels:
                a = results.get(ours, {}).get(str(c))
                b = results.get(other, {}).get(str(c))
                if ours != other and a and b and b.get("tokens_per_s"):
                    ratios[f"{ours}/{other} c{c}"] = a["tokens_per_s"] / b["tokens_per_s"]
    for target in targets:
        low_c, high_c = (results[target].get(str(c)) for c in (levels[0], levels[-1]))
        for phase in ("", "burst", "steady"):
            one, many = (r if not phase else (r or {}).get(phase) for r in (low_c, high_c))
            if one and many and one.get("ttft_p99_ms"):
                name = f"{target}{' ' + phase if phase else ''} ttft_p99 c{levels[-1]}/c{levels[0]}"
                ratios[name] = many["ttft_p99_ms"] / one["ttft_p99_ms"]
                if phase:
                    ratios[name.replace("p99", "p50")] = many["ttft_p50_ms"] / one["ttft_p50_ms"]
                    for q in ("p50", "p99"):
                        ratios[name.replace("ttft_p99", f"ttft1_{q}")] = (
                            many[f"ttft1_{q}_ms"] / one[f"ttft1_{q}_ms"]
                        )
    for key, value in ratios.items():
        print(f"{key}: {value:.2f}x")
    out_dir = Path(__file__).parent / "results"
    out_dir.mkdir(exist_ok=True)
    out = out_dir / f"llm-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(
        json.dumps(
            {
                "size": args.size,
                "concurrency": levels,
                "prompt_tokens": prompt,
                "output_tokens": output,
                "requests_per_client": args.requests,
                "min_requests": args.min_requests,
                "warmup": args.warmup,
                "repeats": args.repeats,
                "stagger_ms": args.stagger_ms,
                "max_num_batched_tokens": args.max_num_batched_tokens,
                "loadavg_before": load_before,
                "loadavg_after": benchlib.loadavg(),
                "precisions": precisions,
                "results": results,
                "ratios": ratios,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
