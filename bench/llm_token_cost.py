"""Where the default engine's time per output token goes at c=1 (issue 39), greedy, against
the weight-bandwidth limit: the bytes a decode step must read (every weight but the input
embedding, plus the KV cache) over this machine's measured read bandwidth (bench/membw.py).

Per dtype, one engine in process and one server (same model.json), their rounds alternated:
- `plain`: the in-process time per output token, no timers installed (the headline);
- `timed`: the same with timers around the parts of a step (they cost a little themselves):
  linears (every nn.Linear, packed or fused, and the LM head), attention (the attention
  function), KV write (the cache's update), the rest of the forward pass (norms, RoPE,
  residuals, masks, transformers' Python), sampling (`_emit` less what it calls per token),
  detokenizing (the tokenizer's decode), bookkeeping (`_advance` less decode and sink), the
  hand-off (the engine thread's side of passing a step's outputs to the event loop, as the
  backend does), and the step loop (admission, locks: the gap less the decode step);
- `loop`: the gap between outputs as an asyncio loop in this process receives them;
- `http`: the same stream over HTTP from the real server, read with the openai client
  (chat completions, streaming): the wire's cost is http - loop.

    python bench/llm_token_cost.py [--size 100m] [--dtype float32,bfloat16] [--tokens 64]
                                   [--rounds 5] [--threads 0] [--no-http]

Prints a table per dtype and writes bench/results/llm_token_cost-<timestamp>.json."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import benchlib
from llm_servers import process, server_argv
from membw import Bandwidth, read_bandwidth

PROMPT = "The sea is wide and deep, and the ships that sail on it carry"


class Timers:
    """Nanoseconds per named part, summed over a request's decode steps (the prefill's
    pass is not counted: `steps` wraps the decode step and turns the others on)."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = defaultdict(int)
        self.steps = 0
        self.active = False

    def add(self, name: str, ns: int) -> None:
        if self.active:
            self.ns[name] += ns

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(name, time.perf_counter_ns() - started)

        return timed

    def wrap_step(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def step(*args: Any, **kwargs: Any) -> Any:
            self.active = True
            started = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add("decode step", time.perf_counter_ns() - started)
                self.active = False
                self.steps += 1

        return step


@contextlib.contextmanager
def instrumented(engine: Any, timers: Timers) -> Iterator[None]:
    """Timers around the engine's parts for the length of the block (removed after)."""
    import torch
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    functions: Any = ALL_ATTENTION_FUNCTIONS

    from oceanus.backends.llm.linear import FusedMLP, PackedLinear

    handles = []
    starts: dict[int, int] = {}

    def before(module: Any, _args: Any) -> None:
        starts[id(module)] = time.perf_counter_ns()

    def after(module: Any, _args: Any, _out: Any) -> None:
        timers.add("linears", time.perf_counter_ns() - starts.pop(id(module)))

    inside_fused = {
        id(child)
        for m in engine.model.modules()
        if isinstance(m, FusedMLP)
        for child in m.children()
    }
    for module in engine.model.modules():
        leaf = isinstance(module, FusedMLP | PackedLinear | torch.nn.Linear)
        if leaf and id(module) not in inside_fused:
            handles.append(module.register_forward_pre_hook(before))
            handles.append(module.register_forward_hook(after))
    implementation = engine.model.config._attn_implementation
    # A local entry over the registered one, deleted after.
    functions[implementation] = timers.wrap("attention", functions[implementation])
    tokenizer = engine.tokenizer
    methods = {"_forward": "forward", "_advance": "advance"}
    for method, name in methods.items():
        setattr(engine, method, timers.wrap(name, getattr(engine, method)))
    engine._decode = timers.wrap_step(engine._decode)
    engine.cache.update = timers.wrap("KV write", engine.cache.update)
    tokenizer.decode = timers.wrap("detokenize", tokenizer.decode)
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        del functions[implementation]
        for method in [*methods, "_decode"]:
            delattr(engine, method)
        del engine.cache.update
        del tokenizer.decode


def generate(engine: Any, tokens: int, timers: Timers | None) -> dict[str, Any]:
    """One greedy request of `tokens` outputs; its engine-side and loop-side gaps (ms)."""
    from oceanus.core.generation import SamplingParams

    loop = asyncio.new_event_loop()
    arrivals: list[int] = []
    outbox: list[Any] = []
    done = threading.Event()

    cpu: list[int] = []  # the process's CPU time at the first and the last token

    def sink(out: Any) -> None:
        if len(out.token_ids) and (len(cpu) == 0 or out.finished):
            cpu.append(time.process_time_ns())
        outbox.append(out)

    def received(items: list[Any]) -> None:
        now = time.perf_counter_ns()
        for item in items:
            if item.token_ids:
                arrivals.append(now)
            if item.finished:
                done.set()
                loop.stop()

    def flush() -> None:  # what LlmInstance._flush does: one loop wake-up per step
        if outbox:
            items = outbox[:]
            outbox.clear()
            loop.call_soon_threadsafe(received, items)

    engine.on_flush = timers.wrap("hand-off", flush) if timers is not None else flush
    with instrumented(engine, timers) if timers is not None else contextlib.nullcontext():
        seq = engine.submit(
            engine.encode(PROMPT), SamplingParams(max_tokens=tokens, ignore_eos=True), sink
        )
        loop.run_forever()
        done.wait()
    loop.close()
    engine.on_flush = None
    gaps = seq.token_gaps_ns
    loop_gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    steps = max(timers.steps if timers is not None else 0, 1)
    return {
        "gap_ms": statistics.median(gaps) / 1e6,
        "mean_gap_ms": statistics.fmean(gaps) / 1e6,
        # CPU time of all the process's threads per token: beside the gap, how much of it was
        # work and how much waiting for a core (a shared machine) or for memory.
        "cpu_ms": (cpu[-1] - cpu[0]) / 1e6 / max(len(seq.generated) - 1, 1),
        "loop_gap_ms": statistics.median(loop_gaps) / 1e6,
        # As the HTTP figure is taken: first output to last, per token.
        "loop_mean_ms": (arrivals[-1] - arrivals[0]) / 1e6 / max(len(arrivals) - 1, 1),
        "parts_ms": {k: v / 1e6 / steps for k, v in (timers.ns if timers else {}).items()},
        "context": len(seq.prompt) + len(seq.generated),
    }


def split(parts: dict[str, float], gap: float) -> dict[str, float]:
    """The timers' nested sums as disjoint parts of one token's gap (ms)."""
    forward = parts.get("forward", 0.0)
    inner = sum(parts.get(k, 0.0) for k in ("linears", "attention", "KV write"))
    advance = parts.get("advance", 0.0)
    own = advance - parts.get("detokenize", 0.0)
    handoff = parts.get("hand-off", 0.0)  # called inside `_emit` and after the step
    step = parts.get("decode step", 0.0)
    return {
        "linears": parts.get("linears", 0.0),
        "attention": parts.get("attention", 0.0),
        "KV write": parts.get("KV write", 0.0),
        "rest of forward": forward - inner,
        "sampling": step - forward - advance - handoff,
        "detokenize": parts.get("detokenize", 0.0),
        "bookkeeping + sink": own,
        "hand-off (engine side)": handoff,
        "step loop": gap - step,
    }


async def http_gap(url: str, tokens: int) -> float:
    """The openai client's streamed chat: ms per output token from the first content chunk to
    the last (a chunk may carry several tokens: one that ends inside a UTF-8 character is held
    back until the character completes), the tokens counted by the server (`usage`)."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    arrivals: list[int] = []
    counted = 0
    stream = await client.chat.completions.create(
        model="llm",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.perf_counter_ns())
        if chunk.usage is not None:
            counted = chunk.usage.completion_tokens
    await client.close()
    # From the first chunk (the prefill's token) on, as the in-process figure counts.
    return (arrivals[-1] - arrivals[0]) / 1e6 / max(counted - 1, 1)


def weight_bytes_per_token(engine: Any) -> int:
    """Every parameter and buffer a decode step reads: all but the input embedding's table
    (one row of it is read; a tied LM head has a packed copy of its own)."""
    embedding = engine.model.get_input_embeddings().weight
    total = 0
    for tensor in [*engine.model.parameters(), *engine.model.buffers()]:
        if tensor is not embedding:
            total += tensor.numel() * tensor.element_size()
    return total


def kv_bytes(engine: Any, context: int) -> int:
    config = engine.model.config
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    element = int(engine.cache.dtype.itemsize)
    return int(config.num_hidden_layers) * 2 * kv_heads * head_dim * element * context


def measure_dtype(args: argparse.Namespace, dtype: str, bandwidth: Bandwidth) -> dict[str, Any]:
    import torch

    from oceanus.backends.llm.args import EngineArgs
    from oceanus.backends.llm.engine import Engine
    from oceanus.examples.llm import cached_llm, write_llm_model

    folder = cached_llm(args.size)
    sizes = {"max_model_len": 1024, "max_num_seqs": 32, "dtype": dtype}
    engine = Engine(
        EngineArgs(model=folder, tokenizer=folder, **sizes),  # type: ignore[arg-type]
        threads=args.threads or torch.get_num_threads(),
    )
    with contextlib.ExitStack() as stack:
        stack.callback(engine.close)
        url = None
        if not args.no_http:
            repo = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="token-cost-")))
            engine_args: dict[str, object] = dict(sizes)
            if args.threads:
                engine_args["num_threads"] = args.threads
            write_llm_model(repo, "llm", size=args.size, engine_args=engine_args)
            port = benchlib.free_port()
            argv, health = server_argv("oceanus", folder, repo, port)
            url = stack.enter_context(process(argv, port, health, repo / "server.log"))
            asyncio.run(http_gap(url, 8))
        generate(engine, 8, None)  # warm-up
        rounds: dict[str, list[Any]] = defaultdict(list)
        for index in range(args.rounds):
            plain = generate(engine, args.tokens, None)
            timers = Timers()
            timed = generate(engine, args.tokens, timers)
            rounds["plain"].append(plain["gap_ms"])
            rounds["loop"].append(plain["loop_gap_ms"])
            rounds["cpu"].append(plain["cpu_ms"])
            rounds["loop_mean"].append(plain["loop_mean_ms"])
            rounds["timed"].append(timed["gap_ms"])
            rounds["timed_mean"].append(timed["mean_gap_ms"])
            rounds["parts"].append(split(timed["parts_ms"], timed["mean_gap_ms"]))
            if url is not None:
                rounds["http"].append(asyncio.run(http_gap(url, args.tokens)))
            print(
                f"{dtype} round {index}: plain {plain['gap_ms']:.1f} ms, timed "
                f"{timed['gap_ms']:.1f}, loop {plain['loop_gap_ms']:.1f}, http "
                f"{rounds['http'][-1] if url else '-'} (load {benchlib.loadavg()})",
                flush=True,
            )
        context = timed["context"]
        weights = weight_bytes_per_token(engine)
        kv = kv_bytes(engine, context // 2)  # the mean context over the request's steps
    medians = {k: statistics.median(v) for k, v in rounds.items() if k != "parts"}
    # The split of the round whose timed gap is the median: its parts add up (medians taken
    # part by part would not, on a machine whose load swings between rounds).
    order = sorted(range(args.rounds), key=lambda i: rounds["timed_mean"][i])
    middle = order[len(order) // 2]
    parts = rounds["parts"][middle]
    limit_ms = (weights + kv) / bandwidth.bytes_per_s * 1e3
    cpu_limit_ms = (weights + kv) / bandwidth.bytes_per_cpu_s * 1e3
    return {
        "dtype": dtype,
        "rounds": {k: v for k, v in rounds.items()},
        "median_ms": medians,
        "parts_ms": parts,
        "parts_gap_ms": rounds["timed_mean"][middle],
        "weight_bytes_per_token": weights,
        "kv_bytes_per_token": kv,
        "bandwidth_limit_ms": limit_ms,
        "plain_over_limit": medians["plain"] / limit_ms,
        "cpu_limit_ms": cpu_limit_ms,
        "cpu_over_cpu_limit": medians["cpu"] / cpu_limit_ms,
    }


def report(result: dict[str, Any]) -> str:
    med = result["median_ms"]
    limit = result["bandwidth_limit_ms"]
    read = result["weight_bytes_per_token"] + result["kv_bytes_per_token"]
    rows: list[list[object]] = []
    for part, ms in result["parts_ms"].items():
        rows.append([f"  {part}", f"{ms:.2f}", f"{ms / result['parts_gap_ms'] * 100:.0f}%"])
    rows += [
        ["the median round's timed gap, mean (the sum)", f"{result['parts_gap_ms']:.2f}", ""],
        ["timed gap, median", f"{med['timed']:.2f}", ""],
        ["plain gap, engine side (median)", f"{med['plain']:.2f}", ""],
        ["plain gap, asyncio loop side (median)", f"{med['loop']:.2f}", ""],
        ["plain, process CPU time per token", f"{med['cpu']:.2f}", ""],
    ]
    if "http" in med:
        rows.append(["over HTTP, openai client (first to last)", f"{med['http']:.2f}", ""])
        rows.append(["  the same in process, loop side", f"{med['loop_mean']:.2f}", ""])
        rows.append(["  the wire (the difference)", f"{med['http'] - med['loop_mean']:.2f}", ""])
    rows.append(
        [
            f"weight-bandwidth limit ({read / 1e6:.0f} MB/token)",
            f"{limit:.2f}",
            f"plain = {result['plain_over_limit']:.2f}x",
        ]
    )
    rows.append(
        [
            "the same read in CPU time",
            f"{result['cpu_limit_ms']:.2f}",
            f"CPU time = {result['cpu_over_cpu_limit']:.2f}x",
        ]
    )
    return benchlib.table([f"{result['dtype']}: ms per output token", "ms", "share"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="100m")
    parser.add_argument("--dtype", default="float32,bfloat16")
    parser.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: its default)")
    parser.add_argument("--no-http", action="store_true", help="skip the server")
    args = parser.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = benchlib.loadavg()
    bandwidth = read_bandwidth()
    print(
        f"read bandwidth {bandwidth.bytes_per_s / 1e9:.1f} GB/s, "
        f"{bandwidth.bytes_per_cpu_s / 1e9:.1f} GB per CPU-second",
        flush=True,
    )
    results = [measure_dtype(args, dtype, bandwidth) for dtype in args.dtype.split(",")]
    for result in results:
        print(report(result))
    print(f"load average before {load_before}, after {benchlib.loadavg()}")
    document = {
        "size": args.size,
        "tokens": args.tokens,
        "rounds": args.rounds,
        "threads": args.threads or torch.get_num_threads(),
        "bandwidth": bandwidth.__dict__,
        "loadavg_before": load_before,
        "loadavg_after": benchlib.loadavg(),
        "results": results,
    }
    benchlib.write_results("llm_token_cost", document)


if __name__ == "__main__":
    main()
