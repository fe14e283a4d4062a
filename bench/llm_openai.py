"""The OpenAI route against `generate_stream` on one server, in one run (issue 26's target:
the OpenAI route's output tokens/s >= 0.95x the generate_stream route's), and how fast
`/v2/health/ready` answers while the streams run (target: every probe within 50 ms at c32).

All three routes do the same work: the same prompts, the same output lengths (EOS ignored,
greedy), and the same prompt tokens. The chat route wraps its message in the model's chat
template (16 more tokens per prompt on the 100m model, +16% prefill for 32-128 token prompts),
so `generate_stream` and `/v1/completions` are sent that rendered text (the template applied
here with transformers' `apply_chat_template`, as the server applies it) and
`/v1/chat/completions` the bare message. Each route's prompt tokens, as the server counted them
(`num_input_tokens`, `usage.prompt_tokens`), are summed per run and shown in the table: equal
figures are the check that the work was equal. Output tokens come from the servers' own counts.
The routes alternate per concurrency level and repeat (`--repeats`), so machine noise hits all
alike; the table shows each route's median tokens/s, the median of the per-repeat ratios to
generate_stream, and the worst health probe of all repeats (one every 100 ms). The client's
own heap is frozen (`gc.freeze()`) before the runs, so that its garbage collector's pauses are
not counted as the server's.

    python bench/llm_openai.py [--size tiny|100m] [--concurrency 1,8,32] [--prompt-tokens 32,512]
                           [--output-tokens 64,256] [--requests 1] [--repeats 1]

Prints a table and writes bench/results/llm_openai-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import benchlib
from llm import _one_sse, add_workload_args, process, server_argv
from llm_inproc import Job, make_jobs, summarize

ROUTES = ("generate_stream", "completions", "chat")


def _request(route: str, session: Any, url: str, job: Rendered, prompts: list[int]) -> Any:
    """One streamed request; the prompt tokens the server counted are appended to `prompts`."""
    sampling = {"max_tokens": job.tokens, "temperature": 0, "ignore_eos": True}
    counted = [0]
    if route == "generate_stream":
        body = {
            "text_input": job.rendered,
            "stream": True,
            "sampling_parameters": json.dumps(sampling),
            "return_num_input_tokens": True,
            "return_num_output_tokens": True,
        }

        def generated(event: dict[str, Any]) -> int:
            counted[0] = max(counted[0], int(event.get("num_input_tokens", 0)))
            return int(event.get("num_output_tokens", 0))

        sample = _one_sse(session, f"{url}/v2/models/llm/generate_stream", body, generated)
        return _counting(sample, counted, prompts)

    def tokens(event: dict[str, Any]) -> int:
        usage = event.get("usage")
        if usage:  # the last chunk: the total (include_usage)
            counted[0] = int(usage["prompt_tokens"])
            return 0
        choices = event.get("choices") or []
        if not choices:
            return 0
        part = (
            choices[0].get("text") if route == "completions" else choices[0]["delta"].get("content")
        )
        return 1 if part else 0

    body = {"model": "llm", "stream": True, "stream_options": {"include_usage": True}, **sampling}
    if route == "completions":
        body["prompt"] = job.rendered
        path = "/v1/completions"
    else:
        body["messages"] = [{"role": "user", "content": job.job.prompt}]
        path = "/v1/chat/completions"
    return _counting(_one_sse(session, f"{url}{path}", body, tokens), counted, prompts)


async def _counting(sample: Any, counted: list[int], prompts: list[int]) -> Any:
    done = await sample
    prompts.append(counted[0])
    return done


@dataclass
class Rendered:
    """A job, and its prompt in the model's chat template (what the chat route prefills)."""

    job: Job
    rendered: str

    @property
    def tokens(self) -> int:
        return self.job.tokens


async def _run(route: str, url: str, jobs: list[Rendered], concurrency: int) -> dict[str, Any]:
    import aiohttp

    queue = list(reversed(jobs))
    samples: list[Any] = []
    prompts: list[int] = []
    probes: list[float] = []
    done = asyncio.Event()

    async def client(session: Any) -> None:
        while queue:
            samples.append(await _request(route, session, url, queue.pop(), prompts))

    async def probe(session: Any) -> None:
        """/v2/health/ready every 100 ms while the streams run."""
        while not done.is_set():
            began = time.perf_counter()
            async with session.get(f"{url}/v2/health/ready") as response:
                await response.read()
                assert response.status == 200
            probes.append((time.perf_counter() - began) * 1000)
            await asyncio.sleep(0.1)

    timeout = aiohttp.ClientTimeout(total=3600)
    connector = aiohttp.TCPConnector(limit=concurrency + 2)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        prober = asyncio.ensure_future(probe(session))
        began = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        wall = time.perf_counter() - began
        done.set()
        await prober
    result: dict[str, Any] = summarize(samples, wall)
    result["completed"] = len(samples)
    result["prompt_tokens"] = sum(prompts)
    result["health_max_ms"] = max(probes) if probes else 0.0
    result["health_p50_ms"] = benchlib.percentile(probes, 50) if probes else 0.0
    return result


def _render(tokenizer: Any, prompt: str) -> str:
    messages = [{"role": "user", "content": prompt}]
    return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_workload_args(parser)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=1, help="runs of every route per level")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    low, high = (int(x) for x in args.prompt_tokens.split(","))
    prompt = (low, high)
    low, high = (int(x) for x in args.output_tokens.split(","))
    output = (low, high)
    load_before = benchlib.loadavg()

    from transformers import AutoTokenizer

    from oceanus.examples.llm import cached_llm, write_llm_model

    folder = cached_llm(args.size)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    jobs = {
        c: [
            Rendered(job, _render(tokenizer, job.prompt))
            for job in make_jobs(tokenizer, c * args.requests, prompt, output)
        ]
        for c in levels
    }
    # Room for the longest prompt (random ids re-encode longer), its output and the chat
    # template: the OpenAI routes refuse what the context cannot hold, as OpenAI does.
    longest = max(len(job.job.prompt_ids) for batch in jobs.values() for job in batch)
    max_len = longest + output[1] + 64
    # This client holds transformers' ~300k objects too: a full collection of them (~160 ms)
    # stalled its own loop and showed up as a slow health probe. Out of the collector's sight.
    gc.collect()
    gc.freeze()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-openai-"))
    repo = log_dir / "repo"
    engine_args = {"max_model_len": max_len, "max_num_seqs": args.max_num_seqs}
    write_llm_model(repo, "llm", size=args.size, engine_args=engine_args)
    port = benchlib.free_port()
    argv, health = server_argv("oceanus", folder, repo, port)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {route: {} for route in ROUTES}
    with process(argv, port, health, log_dir / "oceanus.log") as url:
        for route in ROUTES:
            asyncio.run(_run(route, url, jobs[levels[0]][:1], 1))  # warm-up
        for c in levels:
            for repeat in range(args.repeats):
                for route in ROUTES:
                    result = asyncio.run(_run(route, url, jobs[c], c))
                    runs[route].setdefault(str(c), []).append(result)
                    shown = {k: round(v, 2) for k, v in result.items()}
                    print(f"{route:15s} c={c:<3d} #{repeat} {json.dumps(shown)}", flush=True)
    rows = []
    results: dict[str, dict[str, Any]] = {route: {} for route in ROUTES}
    for c in levels:
        base_runs = runs["generate_stream"][str(c)]
        for route in ROUTES:
            done = runs[route][str(c)]
            ratios = [
                r["tokens_per_s"] / b["tokens_per_s"]
                for r, b in zip(done, base_runs, strict=True)
                if b["tokens_per_s"]
            ]
            r = {
                "completed": min(x["completed"] for x in done),
                "prompt_tokens": benchlib.median([x["prompt_tokens"] for x in done]),
                "tokens_per_s": benchlib.median([x["tokens_per_s"] for x in done]),
                "ratio": benchlib.median(ratios) if ratios else 0.0,
                "ttft_p50_ms": benchlib.median([x["ttft_p50_ms"] for x in done]),
                "tpot_p50_ms": benchlib.median([x["tpot_p50_ms"] for x in done]),
                "health_max_ms": max(x["health_max_ms"] for x in done),
            }
            results[route][str(c)] = r
            rows.append(
                [
                    route,
                    c,
                    f"{r['completed']}/{len(jobs[c])}",
                    r["prompt_tokens"],
                    benchlib.fmt_num(r["tokens_per_s"]),
                    f"{r['ratio']:.2f}x",
                    benchlib.fmt_num(r["ttft_p50_ms"]),
                    benchlib.fmt_num(r["tpot_p50_ms"]),
                    benchlib.fmt_num(r["health_max_ms"]),
                ]
            )
    print(
        benchlib.table(
            [
                "route",
                "c",
                "done",
                "prompt tokens",
                "tok/s",
                "vs generate_stream",
                "TTFT p50 ms",
                "TPOT p50 ms",
                "health max ms",
            ],
            rows,
        )
    )
    load_after = benchlib.loadavg()
    print(
        f"model {args.size}; {args.repeats} repeat(s), medians; load average before "
        f"{load_before}, after {load_after} (a shared machine)"
    )
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"llm_openai-{stamp}.json").write_text(
        json.dumps(
            {
                "args": vars(args),
                "load_before": load_before,
                "load_after": load_after,
                "results": results,
                "runs": runs,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
