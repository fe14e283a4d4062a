"""Prefix caching (vLLM's automatic prefix caching, on by default): a finished sequence's full
blocks are kept and a later prompt that starts with them prefills only the rest. It must never
change the output: greedy tokens with a hit equal transformers' `generate`, when part of the
prompt matches and when all of it does (the last token is then computed again for its logits),
and with a budget so small that cached blocks are evicted to admit the next sequences."""

from __future__ import annotations

import itertools
import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch

from oceanus.backends.llm.args import EngineArgs, read_engine_args
from oceanus.backends.llm.engine import Engine
from oceanus.backends.llm.kv_cache import SlotCache, block_hashes
from oceanus.backends.llm.memory import bytes_per_token
from oceanus.examples.llm import cached_llm

sys.path.insert(0, str(Path(__file__).parent))
from llm_testlib import PROMPTS
from test_llm_engine import reference
from test_llm_kv_memory import _config, _greedy

BLOCK = 4


def _engine(**kw: Any) -> Engine:
    folder = cached_llm("tiny")
    return Engine(EngineArgs(model=folder, tokenizer=folder, block_size=BLOCK, **kw))


def _prompts(engine: Engine) -> list[list[int]]:
    """A shared prefix of several blocks, then: a different tail (part of the prompt
    matches), the same prompt cut to whole blocks (all of it matches), and a prompt that
    parts inside the prefix's second block."""
    shared = engine.encode(PROMPTS[3] + " " + PROMPTS[1])
    whole = shared[: len(shared) // BLOCK * BLOCK]
    assert len(whole) >= 4 * BLOCK
    other = engine.encode(" the moon and the stars")[1:]
    return [
        whole,
        whole[: 3 * BLOCK + 1] + other,
        list(whole),
        whole[: BLOCK + 2] + other,
    ]


def test_greedy_output_with_a_hit_equals_generate() -> None:
    engine = _engine()
    try:
        prompts = _prompts(engine)
        lengths = [6, 6, 6, 6]
        got = []
        for ids, length in zip(prompts, lengths, strict=True):  # one after another: each may hit
            got += _greedy(engine, [ids], [length])
        counters = engine.counters
        assert counters.prefix_cache_queries == sum(len(p) for p in prompts)
        # The second reuses 3 blocks, the third all its blocks but its last token (computed
        # again), the fourth one block.
        whole = len(prompts[0])
        assert counters.prefix_cache_hits == 3 * BLOCK + (whole - 1) + BLOCK
        assert counters.prompt_tokens == sum(len(p) for p in prompts)
    finally:
        engine.close()
    assert got == reference(prompts, lengths)


def test_hits_in_a_burst_and_off_by_model_json(tmp_path: Path) -> None:
    """Sequences that share a cached prefix, prefilled together in one packed pass, equal
    generate; `enable_prefix_caching: false` (vLLM's key) turns the cache off."""
    engine = _engine()
    try:
        prompts = _prompts(engine)
        _greedy(engine, [prompts[0]], [3])
        lengths = [5, 7, 4, 6]
        got = _greedy(engine, prompts, lengths)
        assert engine.counters.prefix_cache_hits > 0
    finally:
        engine.close()
    assert got == reference(prompts, lengths)
    folder = cached_llm("tiny")
    (tmp_path / "model.json").write_text(
        json.dumps({"model": str(folder), "enable_prefix_caching": False})
    )
    args = read_engine_args(tmp_path, "m")
    assert args.enable_prefix_caching is False
    (tmp_path / "model.json").write_text(json.dumps({"model": str(folder)}))
    assert read_engine_args(tmp_path, "m").enable_prefix_caching is True
    off = _engine(enable_prefix_caching=False)
    try:
        _greedy(off, [prompts[0]], [3])
        _greedy(off, [prompts[0]], [3])
        assert off.counters.prefix_cache_hits == 0 and off.cache.cached_tokens == 0
    finally:
        off.close()


def test_a_tiny_budget_evicts_cached_blocks_and_admits_everyone() -> None:
    """A budget of 48 tokens (two sequences of 24): every finished sequence leaves blocks
    behind, which must be evicted (least recently used first) for the next ones; all complete
    and equal generate, and the pool never holds more than the budget."""
    per_token = bytes_per_token(_config(), "float32")
    engine = _engine(max_model_len=48, kv_cache_memory_bytes=48 * per_token)
    assert engine.budget == 48
    peak = [0]
    engine.on_step = lambda e: peak.__setitem__(0, max(peak[0], e.cache.allocated_bytes))
    try:
        # Each prompt twice in a row (the second hits), each sequence half the budget: the
        # third sequence needs the first one's blocks evicted.
        prompts = [engine.encode(p) for p in PROMPTS for _ in range(2)]
        lengths = [max(4, 24 - len(p)) for p in prompts]
        got = []
        for ids, length in zip(prompts, lengths, strict=True):
            got += _greedy(engine, [ids], [length])
        got += _greedy(engine, prompts, lengths)  # a burst: they wait for each other
        assert engine.cache.evictions > 0
        assert engine.counters.prefix_cache_hits > 0
    finally:
        engine.close()
    assert got == reference(prompts, lengths) * 2
    assert peak[0] <= 48 * per_token


def test_the_pool_keeps_evicts_and_copies_cached_blocks() -> None:
    cache = SlotCache(2, 2, 4, torch.float32, max_tokens=32, block=4, prefix_caching=True)
    tokens = list(range(10))
    cache.reserve(0, 10, 12)
    start = cache.offset(0)
    cache._pool[:, :, :, start : start + 10] = torch.arange(10.0)[:, None]
    cache.keep(0, tokens)  # 10 tokens: 2 whole blocks kept
    assert cache.cached_tokens == 8 and cache.held_tokens == 0
    entry, cached = cache.lookup([*tokens[:9], 99])
    assert cached == 8
    assert cache.lookup([1, *tokens[1:]])[1] == 0  # the chain: a changed first block
    cache.take(1, entry, 8, 16)
    first = cache.offset(1)
    assert torch.equal(cache._pool[0, 0, 0, first : first + 8, 0], torch.arange(8.0))
    cache.free(1)
    cache.reserve(2, 30, 30)  # needs the entry's room: it is evicted
    assert cache.evictions == 1 and cache.cached_tokens == 0 and cache.size <= 32
    assert block_hashes(tokens, 4)[1] != block_hashes(tokens[4:8] * 2, 4)[1]


def test_random_sequences_keep_their_cells_through_hits_evictions_and_compaction() -> None:
    """2,000 random starts (with and without hits), growths and ends over a 64-token pool
    whose live reservations fill it: every live sequence's cells and every cached entry's
    cells still hold their tokens after each operation, ranges never overlap, and the pool
    never exceeds the budget."""
    rng = random.Random(0)
    budget, block = 64, 4
    cache = SlotCache(1, 1, 1, torch.float32, max_tokens=budget, block=block, prefix_caching=True)
    bases = [list(range(start, start + 24)) for start in (0, 30, 60)]
    live: dict[int, tuple[list[int], int]] = {}  # slot -> (tokens, reservation)
    hits = 0

    def cells(start: int, count: int) -> list[float]:
        return cache._pool[0, 0, 0, start : start + count, 0].tolist()

    def write(slot: int, tokens: list[int], start: int) -> None:
        first = cache.offset(slot)
        values = torch.tensor(tokens[start:], dtype=torch.float32)
        cache._pool[0, 0, 0, first + start : first + len(tokens), 0] = values

    for _ in range(2000):
        op = rng.random()
        if op < 0.35 and len(live) < 4:
            tokens = [*rng.choice(bases)[: rng.randint(1, 20)], 100 + rng.randint(0, 9)]
            limit = len(tokens) + rng.randint(0, 6)
            if sum(r for _, r in live.values()) + limit > budget:
                continue
            slot = min(set(range(4)) - set(live))
            entry, cached = cache.lookup(tokens)
            cached = min(cached, len(tokens) - 1)
            if cached > 0:
                hits += 1
                cache.take(slot, entry, cached, limit)
                assert cells(cache.offset(slot), cached) == tokens[:cached]
            cache.reserve(slot, len(tokens), limit)
            write(slot, tokens, cached)
            live[slot] = (tokens, limit)
        elif op < 0.75 and live:
            slot = rng.choice(sorted(live))
            tokens, limit = live[slot]
            if len(tokens) < limit:
                tokens.append(100 + rng.randint(0, 9))
                cache.reserve(slot, len(tokens), limit)
                write(slot, tokens, len(tokens) - 1)
        elif live:
            slot = rng.choice(sorted(live))
            tokens, _ = live.pop(slot)
            if rng.random() < 0.8:
                cache.keep(slot, tokens[: rng.randint(0, len(tokens))])
            else:
                cache.free(slot)
        for slot, (tokens, _) in live.items():
            assert cells(cache.offset(slot), len(tokens)) == tokens
        for key, entry in cache._entries.items():
            assert cells(cache._ranges[key][0], len(entry.tokens)) == entry.tokens
        spans = sorted(cache._ranges.values())
        for (start, count), (after, _) in itertools.pairwise(spans):
            assert start + count <= after
        assert all(start + count <= cache.size for start, count in spans)
        assert cache.size <= budget
    assert hits > 100 and cache.evictions > 0 and cache.compactions > 0, (hits, cache.evictions)
