"""How long the event loop stalls while a burst of chat requests is planned (template rendered,
prompt tokenized: oceanus/frontends/openai/plans.py), three ways side by side in one run:
on the loop, in a worker thread with `Tokenizer.encode` (holds the GIL), and in a worker thread
with `encode_batch` (lets go of it; what the frontend does). A probe coroutine sleeping 1 ms
records the worst overshoot per burst; the plans must come out identical.

    python bench/investigations/openai_plan_lag.py [--size 100m] [--burst 32] [--repeats 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: benchlib
import benchlib
from llm_inproc import make_jobs


async def _burst(
    bodies: list[dict[str, Any]], tokenizer: Any, threaded: bool
) -> tuple[float, list[tuple[str, int | None]]]:
    from oceanus.frontends.openai import plans
    from oceanus.frontends.openai.protocol import ChatCompletionRequest

    lag, stop = 0.0, False

    async def probe() -> None:
        nonlocal lag
        while not stop:
            began = time.perf_counter()
            await asyncio.sleep(0.001)
            lag = max(lag, time.perf_counter() - began - 0.001)

    prober = asyncio.ensure_future(probe())
    await asyncio.sleep(0.01)

    async def one(raw: dict[str, Any]) -> Any:
        body = ChatCompletionRequest.model_validate(raw)
        if threaded:
            return await asyncio.to_thread(plans.chat_plan, body, tokenizer, None)
        return plans.chat_plan(body, tokenizer, None)

    done = await asyncio.gather(*(one(dict(body)) for body in bodies))
    stop = True
    await prober
    return lag * 1000, [(p.prompts[0].text, p.prompts[0].tokens) for p in done]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", default="100m")
    parser.add_argument("--burst", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from oceanus.examples.llm import cached_llm
    from oceanus.frontends.openai.tokenizer import ModelTokenizer, load_tokenizer

    folder = cached_llm(args.size)
    tokenizer = load_tokenizer([folder], None, None)
    assert tokenizer is not None
    jobs = make_jobs(AutoTokenizer.from_pretrained(folder), args.burst, (32, 512), (64, 64))
    bodies = [
        {"model": "llm", "max_tokens": 64, "messages": [{"role": "user", "content": job.prompt}]}
        for job in jobs
    ]
    hf = tokenizer.tokenizer

    def plain(text: str, add_special_tokens: bool = True) -> list[int]:
        return list(hf.encode(text, add_special_tokens=add_special_tokens).ids)

    batch = ModelTokenizer.encode.__get__(tokenizer)
    ways: dict[str, tuple[bool, Callable[[str, bool], list[int]]]] = {
        "on the loop, encode": (False, plain),
        "thread, encode": (True, plain),
        "thread, encode_batch": (True, batch),
    }
    lags: dict[str, list[float]] = {name: [] for name in ways}
    outputs = set()
    load_before = benchlib.loadavg()
    for _ in range(args.repeats):
        for name, (threaded, encode) in ways.items():
            tokenizer.encode = encode  # type: ignore[method-assign,assignment]
            lag, plans = asyncio.run(_burst(bodies, tokenizer, threaded))
            lags[name].append(lag)
            outputs.add(tuple(plans))
    assert len(outputs) == 1, "the ways planned differently"
    rows = [
        [name, benchlib.fmt_num(statistics.median(v)), benchlib.fmt_num(max(v))]
        for name, v in lags.items()
    ]
    print(benchlib.table(["planning", "loop lag ms (median)", "loop lag ms (max)"], rows))
    print(
        f"{args.burst} chats of 32-512 tokens, {args.repeats} bursts each, model {args.size}; "
        f"load average before {load_before}, after {benchlib.loadavg()} (a shared machine)"
    )


if __name__ == "__main__":
    main()
