"""A small asyncio + aiohttp closed-loop load generator: N concurrent clients, one request each
in flight, for a warm-up then a measurement window.

Two request kinds:

* ``json``: ``POST /predict`` with ``{"inputs": ...}`` nested lists (bench/naive_server.py);
* ``kserve``: ``POST /v2/models/<m>/infer`` with the binary tensor extension (Oceanus, Triton);
  run.py uses this only when perf_analyzer is not installed.

Bodies are encoded once before the run (a few random samples, rotated), so the client spends its
CPU on HTTP, not on encoding.

    python bench/loadgen.py --url http://127.0.0.1:40123 --model resnet50_onnx --kind json \
        --concurrency 8 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib


def json_body(model: benchlib.ModelInfo, sample: dict[str, np.ndarray]) -> bytes:
    """``{"inputs": [[...]]}`` for one-input models, ``{"inputs": {name: [[...]]}}`` otherwise."""
    if len(sample) == 1:
        inputs: Any = next(iter(sample.values())).tolist()
    else:
        inputs = {name: array.tolist() for name, array in sample.items()}
    return json.dumps({"inputs": inputs}).encode()


def kserve_binary_body(
    sample: dict[str, np.ndarray], outputs: list[str]
) -> tuple[bytes, dict[str, str]]:
    """A KServe v2 infer request using the binary tensor extension (and binary outputs)."""
    header: dict[str, Any] = {
        "inputs": [],
        "outputs": [{"name": name, "parameters": {"binary_data": True}} for name in outputs],
    }
    blobs = []
    for name, array in sample.items():
        raw = np.ascontiguousarray(array).tobytes()
        header["inputs"].append(
            {
                "name": name,
                "shape": list(array.shape),
                "datatype": benchlib.TRITON_DTYPES[array.dtype],
                "parameters": {"binary_data_size": len(raw)},
            }
        )
        blobs.append(raw)
    head = json.dumps(header).encode()
    return head + b"".join(blobs), {
        "Inference-Header-Content-Length": str(len(head)),
        "Content-Type": "application/octet-stream",
    }


Bodies = list[tuple[bytes, dict[str, str]]]


def build_requests(
    model: benchlib.ModelInfo, kind: str, base_url: str, variants: int = 4, seed: int = 0
) -> tuple[str, Bodies]:
    rng = np.random.default_rng(seed)
    bodies = []
    for _ in range(variants):
        sample = model.sample(1, rng)
        if kind == "json":
            bodies.append((json_body(model, sample), {"Content-Type": "application/json"}))
        elif kind == "kserve":
            bodies.append(kserve_binary_body(sample, model.outputs))
        else:
            raise ValueError(kind)
    path = "/predict" if kind == "json" else f"/v2/models/{model.name}/infer"
    return base_url.rstrip("/") + path, bodies


async def run_load(
    url: str,
    bodies: Bodies,
    concurrency: int,
    seconds: float,
    warmup: float,
    drain_timeout: float = 60.0,
    request_timeout: float = 300.0,
    max_warmup: float = 20.0,
    min_completions: int = 0,
    max_window: float | None = None,
) -> dict[str, Any]:
    """Closed loop: *concurrency* workers each send, wait for the answer, send again.

    Warm-up lasts at least *warmup* seconds and until every worker has had one answer (a slow
    single-queue server needs ``concurrency x service time`` to reach steady state), at most
    *max_warmup*. Counted: answers that arrive inside the window that follows, and their
    latencies; the window lasts *seconds*, longer (up to *max_window*) until it holds
    *min_completions* answers, so that slow servers get a meaningful count. No request is started
    after the window; those in flight then are awaited up to *drain_timeout* (0: cancelled at
    once), and ``undrained`` says how many were still running then."""
    import aiohttp

    loop = asyncio.get_running_loop()
    start = loop.time()
    latencies: list[float] = []
    errors: list[str] = []
    answered: set[int] = set()
    window: list[float] = []  # [start, end] once the warm-up is over
    window_set = asyncio.Event()
    completed_in_window = 0

    def maybe_open_window() -> None:
        now = loop.time()
        if window or now < start + warmup:
            return
        if len(answered) >= concurrency or now >= start + max_warmup:
            window.extend((now, now + seconds))
            window_set.set()

    def extend_window(now: float) -> None:
        # Past the nominal end but short of min_completions: keep going (up to max_window).
        if completed_in_window < min_completions and now - window[0] < limit:
            window[1] = max(window[1], min(now + 0.5, window[0] + limit))

    limit = max(seconds, max_window or seconds)

    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=request_timeout)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker(index: int) -> None:
            nonlocal completed_in_window
            number = index
            while True:
                sent = loop.time()
                if window and sent >= window[1]:
                    extend_window(sent)
                    if sent >= window[1]:
                        return
                body, headers = bodies[number % len(bodies)]
                number += 1
                try:
                    async with session.post(url, data=body, headers=headers) as response:
                        payload = await response.read()
                        status = response.status
                except (aiohttp.ClientError, asyncio.TimeoutError) as err:
                    errors.append(f"{type(err).__name__}: {err}")
                    await asyncio.sleep(0.05)
                    continue
                done = loop.time()
                if status != 200:
                    errors.append(f"HTTP {status}: {payload[:200]!r}")
                    continue
                answered.add(index)
                if window and done > window[1]:
                    extend_window(done)
                if window and window[0] <= done <= window[1]:
                    completed_in_window += 1
                    latencies.append(done - sent)
                maybe_open_window()

        async def ticker() -> None:
            while not window:
                maybe_open_window()
                await asyncio.sleep(0.05)

        tasks = [asyncio.create_task(worker(i)) for i in range(concurrency)]
        tick = asyncio.create_task(ticker())
        await window_set.wait()
        await tick
        warmed_s = window[0] - start
        while loop.time() < window[1]:
            await asyncio.sleep(max(0.01, window[1] - loop.time()))
            extend_window(loop.time())
        window_s = window[1] - window[0]
        if drain_timeout > 0:
            _done, pending = await asyncio.wait(tasks, timeout=drain_timeout)
        else:
            pending = {t for t in tasks if not t.done()}
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
    return {
        "concurrency": concurrency,
        "window_s": round(window_s, 2),
        "warmup_s": round(warmed_s, 2),
        "warmup_capped": warmed_s >= max_warmup,
        "completed": completed_in_window,
        "throughput": completed_in_window / window_s,
        "p50_ms": benchlib.percentile(latencies, 50) * 1000 if latencies else None,
        "p95_ms": benchlib.percentile(latencies, 95) * 1000 if latencies else None,
        "p99_ms": benchlib.percentile(latencies, 99) * 1000 if latencies else None,
        "avg_ms": float(np.mean(latencies)) * 1000 if latencies else None,
        "errors": len(errors),
        "first_errors": errors[:3],
        "undrained": len(pending),
    }


def run_level(
    url: str, bodies: Bodies, concurrency: int, seconds: float, warmup: float, **kwargs: Any
) -> dict[str, Any]:
    started = time.perf_counter()
    result = asyncio.run(run_load(url, bodies, concurrency, seconds, warmup, **kwargs))
    result["wall_s"] = round(time.perf_counter() - started, 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", default="simple", help="example model name")
    parser.add_argument("--kind", choices=("json", "kserve"), default="json")
    parser.add_argument("--concurrency", default="1,8", help="comma-separated levels")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    args = parser.parse_args()
    repository = benchlib.example_repository([args.model])
    model = benchlib.load_model_info(repository, args.model)
    url, bodies = build_requests(model, args.kind, args.url)
    for level in (int(c) for c in args.concurrency.split(",")):
        result = run_level(url, bodies, level, args.seconds, args.warmup)
        print(json.dumps(result))


if __name__ == "__main__":
    main()
