"""The KV cache's memory (issue 39): cells allocated as sequences grow, within a budget in bytes
named as vLLM names it, admission waiting when the budget is full, and dtype "auto" resolved
from the CPU's flags as vLLM's CPU build resolves it."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch

from oceanus.backends.llm import args as args_module
from oceanus.backends.llm.args import EngineArgs, auto_dtype, read_engine_args
from oceanus.backends.llm.engine import Engine, StepOutput
from oceanus.backends.llm.kv_cache import SlotCache
from oceanus.backends.llm.memory import DEFAULT_BYTES, ENV, GiB, bytes_per_token, kv_budget
from oceanus.backends.llm.sampling import SamplingParams
from oceanus.core.errors import InferenceServerError
from oceanus.examples.llm import cached_llm

sys.path.insert(0, str(Path(__file__).parent))
from llm_testlib import PROMPTS
from test_llm_engine import reference, run_burst

# ---- dtype "auto" ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "dtype"),
    [
        ({"avx2", "avx512f", "avx512_bf16"}, "bfloat16"),
        ({"avx2", "amx_tile", "amx_bf16"}, "bfloat16"),
        ({"avx2", "avx512f", "avx512_vnni"}, "float32"),
        (set(), "float32"),  # not Linux, or no flags line
    ],
)
def test_auto_dtype_follows_the_cpu_flags(flags: set[str], dtype: str) -> None:
    chosen, why = auto_dtype(frozenset(flags))
    assert chosen == dtype
    assert why.startswith("auto: ")


@pytest.mark.parametrize("flags", [frozenset({"avx512_bf16"}), frozenset({"avx2"})])
def test_a_folder_without_dtype_gets_the_auto_choice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: frozenset[str]
) -> None:
    monkeypatch.setattr(args_module, "cpu_flags", lambda: flags)
    (tmp_path / "model.json").write_text(json.dumps({"model": str(cached_llm("tiny"))}))
    args = read_engine_args(tmp_path, "llm")
    assert args.dtype == auto_dtype(flags)[0]
    assert args.dtype_source == auto_dtype(flags)[1]
    # An explicit dtype wins whatever the CPU.
    (tmp_path / "model.json").write_text(
        json.dumps({"model": str(cached_llm("tiny")), "dtype": "float32"})
    )
    assert read_engine_args(tmp_path, "llm").dtype == "float32"


# ---- the budget -----------------------------------------------------------------------------


def _config() -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(cached_llm("tiny"))


def test_the_budget_comes_from_model_json_then_the_environment_then_the_machine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder = cached_llm("tiny")
    config = _config()
    per_token = bytes_per_token(config, "float32")
    monkeypatch.delenv(ENV, raising=False)
    plain = EngineArgs(model=folder, tokenizer=folder)
    # Plenty of memory: vLLM's CPU default, 4 GiB; short of it, half of what is available.
    assert kv_budget(plain, config, 1024, 32, available=64 * GiB).bytes == DEFAULT_BYTES
    short = kv_budget(plain, config, 1024, 32, available=GiB)
    assert short.bytes == GiB // 2 and "half" in short.source
    monkeypatch.setenv(ENV, "1")
    assert kv_budget(plain, config, 1024, 32, available=64 * GiB).bytes == GiB
    sized = EngineArgs(model=folder, tokenizer=folder, kv_cache_memory_bytes=3000 * per_token)
    budget = kv_budget(sized, config, 1024, 32, available=64 * GiB)
    assert (budget.bytes, budget.tokens) == (3000 * per_token, 3000)
    assert "kv_cache_memory_bytes" in budget.source
    # kv_cache_tokens stays a cap (never below one whole sequence).
    capped = EngineArgs(model=folder, tokenizer=folder, kv_cache_tokens=2000)
    assert kv_budget(capped, config, 1024, 32, available=64 * GiB).tokens == 2000
    # bfloat16 halves the bytes of a token: twice the tokens for the same bytes.
    half = EngineArgs(
        model=folder, tokenizer=folder, kv_cache_memory_bytes=3000 * per_token, dtype="bfloat16"
    )
    assert kv_budget(half, config, 1024, 32, available=64 * GiB).tokens == 6000


def test_a_budget_that_cannot_hold_one_sequence_is_refused() -> None:
    folder = cached_llm("tiny")
    config = _config()
    per_token = bytes_per_token(config, "float32")
    small = EngineArgs(model=folder, tokenizer=folder, kv_cache_memory_bytes=100 * per_token)
    with pytest.raises(InferenceServerError) as caught:
        kv_budget(small, config, 1024, 32, available=64 * GiB)
    assert "'max_model_len' to at most 100" in caught.value.message


def test_model_json_reads_the_vllm_keys(tmp_path: Path) -> None:
    (tmp_path / "model.json").write_text(
        json.dumps(
            {"model": str(cached_llm("tiny")), "kv_cache_memory_bytes": 123456789, "block_size": 32}
        )
    )
    args = read_engine_args(tmp_path, "llm")
    assert (args.kv_cache_memory_bytes, args.block_size) == (123456789, 32)


# ---- the pool -------------------------------------------------------------------------------


def _fill(cache: SlotCache, slot: int, cells: int, value: float) -> None:
    first = cache.offset(slot)
    cache._pool[:, :, :, first : first + cells] = value


def _read(cache: SlotCache, slot: int, cells: int) -> torch.Tensor:
    first = cache.offset(slot)
    return cache._pool[:, :, :, first : first + cells]


def test_ranges_grow_move_and_compact_keeping_their_cells() -> None:
    cache = SlotCache(2, 2, 4, torch.float32, max_tokens=64, block=4)
    assert cache.allocated_bytes == 0
    cache.reserve(0, 10, 40)
    cache.reserve(1, 10, 40)
    _fill(cache, 0, 10, 1.0)
    _fill(cache, 1, 10, 2.0)
    assert cache.allocated_bytes == cache.size * cache.token_bytes
    assert cache.size < 64
    # Slot 0 must grow past slot 1's cells: it moves, its cells with it.
    cache.reserve(0, 20, 40)
    assert cache.moves == 1
    _fill(cache, 0, 20, 1.0)
    assert bool((_read(cache, 1, 10) == 2.0).all())
    # Fill the pool up to its ceiling, then free the middle: the next growth compacts.
    cache.reserve(2, 20, 20)
    _fill(cache, 2, 20, 3.0)
    cache.free(1)
    cache.reserve(0, 40, 40)
    assert cache.size <= 64
    assert bool((_read(cache, 0, 20) == 1.0).all())
    assert bool((_read(cache, 2, 20) == 3.0).all())
    # Nothing held: the pool is released.
    cache.free(0)
    cache.free(2)
    assert cache.size == 0 and cache.allocated_bytes == 0


def test_a_range_never_grows_past_its_reservation() -> None:
    cache = SlotCache(1, 1, 4, torch.float32, max_tokens=1000, block=16)
    cache.reserve(0, 100, 110)
    cache.reserve(0, 101, 110)
    assert cache.held_tokens == 110  # a quarter more would be 125: capped at the reservation


# ---- the engine -----------------------------------------------------------------------------


def test_greedy_output_holds_while_ranges_move_and_the_pool_compacts() -> None:
    """Blocks of one token and a budget of one sequence's tokens: every decode step grows a
    range, ranges move past each other, the pool hits its ceiling and compacts; the greedy
    tokens still equal transformers' `generate`, in the per-row attention and in the gather
    path (row_attention off)."""
    lengths = [12, 6, 9, 7]
    folder = cached_llm("tiny")
    config = _config()
    per_token = bytes_per_token(config, "float32")
    tokens, _, prompts = run_burst(
        16, lengths, block_size=1, max_model_len=64, kv_cache_memory_bytes=128 * per_token
    )
    assert tokens == reference(prompts, lengths)
    args = EngineArgs(model=folder, tokenizer=folder, block_size=1, max_num_batched_tokens=16)
    engine = Engine(args, row_attention=False)
    try:
        assert not engine.row_attention
        got = _greedy(engine, [engine.encode(p) for p in PROMPTS], lengths)
    finally:
        engine.close()
    assert got == reference(prompts, lengths)
    assert engine.cache.moves > 0


def _greedy(
    engine: Engine, prompts: list[list[int]], lengths: list[int], watch: Any = None
) -> list[list[int]]:
    """Each prompt's greedy tokens; `watch(output)` sees every output on the engine thread."""
    tokens: list[list[int]] = [[] for _ in prompts]
    done = threading.Semaphore(0)

    def sink(index: int) -> Any:
        def take(out: StepOutput) -> None:
            if watch is not None:
                watch(out)
            tokens[index] += out.token_ids
            if out.finished:
                done.release()

        return take

    for index, (ids, length) in enumerate(zip(prompts, lengths, strict=True)):
        params = SamplingParams(max_tokens=length, temperature=0.0, ignore_eos=True)
        engine.submit(ids, params, sink(index))
    for _ in prompts:
        assert done.acquire(timeout=60)
    return tokens


def test_the_cache_grows_with_the_sequence_and_is_freed_after() -> None:
    """Nothing is allocated at load; a short prompt holds a small fraction of what a long one
    does; when the sequences end the pool is released (prefix caching off: it would keep
    their full blocks, test_llm_prefix_cache.py)."""
    folder = cached_llm("tiny")
    engine = Engine(EngineArgs(model=folder, tokenizer=folder, enable_prefix_caching=False))
    sizes: list[int] = []

    def watch(out: StepOutput) -> None:  # before the last output the sequence still holds cells
        if not out.finished:
            sizes.append(engine.cache.allocated_bytes)

    try:
        assert engine.cache.allocated_bytes == 0
        # The load log's figures: dtype and why, the weights, the budget and its tokens.
        said = engine.describe_memory()
        assert "dtype float32 (default)" in said and "weights " in said
        assert f"= {engine.budget:,} tokens at {engine.cache.token_bytes:,} bytes" in said
        short = engine.encode("The ocean")
        _greedy(engine, [short], [3], watch)
        short_peak = max(sizes)
        sizes.clear()
        long = engine.encode(" ".join(PROMPTS * 12))
        assert len(long) > 20 * len(short)
        _greedy(engine, [long], [3], watch)
        long_peak = max(sizes)
        assert short_peak * 10 < long_peak
        assert long_peak < 2 * (len(long) + 3) * engine.cache.token_bytes
        assert engine.cache.allocated_bytes == 0  # both ended: released
    finally:
        engine.close()


def test_admission_waits_while_the_budget_is_full() -> None:
    """A budget of one max_model_len sequence: a second request that would not fit beside the
    first waits for it to end; the pool never holds more than the budget."""
    folder = cached_llm("tiny")
    per_token = bytes_per_token(_config(), "float32")
    args = EngineArgs(
        model=folder,
        tokenizer=folder,
        max_model_len=64,
        kv_cache_memory_bytes=64 * per_token,
    )
    engine = Engine(args)
    assert engine.budget == 64
    running: list[int] = []
    peak: list[int] = [0]

    def step(e: Any) -> None:
        running.append(len(e._running))
        peak[0] = max(peak[0], e.cache.allocated_bytes)

    engine.on_step = step
    try:
        prompt = engine.encode(PROMPTS[1])
        room = 64 - len(prompt) - 4  # each reserves more than half the budget
        got = _greedy(engine, [prompt, prompt], [room, room])
    finally:
        engine.close()
    assert [len(t) for t in got] == [room, room]
    assert max(running) == 1  # never both at once
    assert peak[0] <= 64 * per_token
