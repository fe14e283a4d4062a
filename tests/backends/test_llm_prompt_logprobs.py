"""Prompt logprobs (vLLM's `prompt_logprobs`; OpenAI's echo with logprobs) from the engine in
process: every prompt token's logprob, rank and top alternatives equal transformers' log-softmax
over the same prompt within 1e-4, whether the prompt was prefilled whole or in chunks across
steps, beside requests that asked for none, and when the prefix cache holds the prompt."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch
from transformers import AutoModelForCausalLM

from oceanus.backends.llm.args import EngineArgs
from oceanus.backends.llm.engine import Engine, StepOutput
from oceanus.backends.llm.sampling import SamplingParams
from oceanus.examples.llm import cached_llm

sys.path.insert(0, str(Path(__file__).parent))
from llm_testlib import PROMPTS

TOP = 3


def _generate(engine: Engine, asks: list[tuple[list[int], SamplingParams]]) -> list[Any]:
    """Submit every request before the engine's first step; each one's outputs."""
    outputs: list[list[StepOutput]] = [[] for _ in asks]
    done = threading.Semaphore(0)

    def sink(index: int) -> Any:
        def take(out: StepOutput) -> None:
            outputs[index].append(out)
            if out.finished:
                done.release()

        return take

    with engine._cond:
        for index, (ids, params) in enumerate(asks):
            engine.submit(ids, params, sink(index))
    for _ in asks:
        assert done.acquire(timeout=60)
    return outputs


def _reference(ids: list[int], generated: list[int]) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(cached_llm("tiny")).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids + generated])).logits[0].float()
    return torch.log_softmax(logits, -1)


@pytest.mark.parametrize("chunk", [512, 7])
def test_prompt_logprobs_equal_transformers(chunk: int) -> None:
    folder = cached_llm("tiny")
    engine = Engine(EngineArgs(model=folder, tokenizer=folder, max_num_batched_tokens=chunk))
    try:
        prompts = [engine.encode(p) for p in PROMPTS]
        asked = SamplingParams(max_tokens=3, temperature=0.0, logprobs=0, prompt_logprobs=TOP)
        plain = SamplingParams(max_tokens=3, temperature=0.0)
        asks = [(ids, asked if i % 2 == 0 else plain) for i, ids in enumerate(prompts)]
        # The same prompt again, after the first run left it in the prefix cache.
        outputs = _generate(engine, asks) + _generate(engine, asks[:1])
    finally:
        engine.close()
    for (ids, params), outs in zip(asks + asks[:1], outputs, strict=True):
        firsts = [o.prompt_logprobs for o in outs if o.prompt_logprobs is not None]
        if params.prompt_logprobs is None:
            assert not firsts  # a request that did not ask pays nothing and gets nothing
            continue
        (steps,) = firsts
        assert outs[0].prompt_logprobs is steps  # they come with the first token
        generated = [t for o in outs for t in o.token_ids]
        expected = _reference(ids, generated)
        assert len(steps) == len(ids) - 1
        for position, step in enumerate(steps):
            row = expected[position]
            token = ids[position + 1]
            assert next(iter(step)) == token  # the prompt's own token first
            logprob, rank = step[token]
            assert abs(logprob - float(row[token])) < 1e-4
            assert rank == int((row > row[token]).sum()) + 1
            values, indices = torch.topk(row, TOP)
            for t, v in zip(indices.tolist(), values.tolist(), strict=True):
                assert abs(step[t][0] - v) < 1e-4
        # The generated tokens are transformers' greedy ones, with its logprobs.
        for offset, token in enumerate(generated):
            row = expected[len(ids) - 1 + offset]
            assert token == int(torch.argmax(row))
            (step,) = [o.logprobs for o in outs if o.token_ids][offset] or [{}]
            assert abs(step[token] - float(row[token])) < 1e-4
