"""Choosing the next token of one sequence from its logits, as vLLM's SamplingParams say."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import torch

from oceanus.core.generation import SamplingParams


@dataclass(slots=True)
class Choice:
    token: int
    logprob: float
    # The `logprobs` most likely tokens with their logprobs (when asked for), chosen one included.
    top: dict[int, float] | None


def needs_row_work(params: SamplingParams) -> bool:
    """Whether a sequence needs more than a plain argmax over the batch."""
    return not (
        params.greedy
        and params.repetition_penalty == 1.0
        and params.presence_penalty == 0.0
        and params.frequency_penalty == 0.0
        and params.logprobs is None
        and params.min_tokens == 0
        and params.guided is None
        and not params.logit_bias
    )


def choose(
    logits: torch.Tensor,
    params: SamplingParams,
    prompt: list[int],
    generated: list[int],
    eos: int | None,
    generator: torch.Generator | None,
) -> Choice:
    """`logits`: this sequence's float32 `[vocab]` row (modified in place)."""
    if params.logit_bias:  # ids beyond the model's rows change nothing (the frontend refuses them)
        pairs = [(t, b) for t, b in params.logit_bias if t < logits.numel()]
        if pairs:
            tokens = torch.tensor([t for t, _ in pairs], dtype=torch.long)
            logits[tokens] += torch.tensor([b for _, b in pairs], dtype=logits.dtype)
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(prompt) | set(generated)), dtype=torch.long)
        picked = logits[seen]
        logits[seen] = torch.where(
            picked > 0, picked / params.repetition_penalty, picked * params.repetition_penalty
        )
    if generated and (params.presence_penalty or params.frequency_penalty):
        counts = Counter(generated)
        tokens = torch.tensor(list(counts), dtype=torch.long)
        times = torch.tensor(list(counts.values()), dtype=logits.dtype)
        logits[tokens] -= params.frequency_penalty * times + params.presence_penalty
    if eos is not None and len(generated) < params.min_tokens:
        logits[eos] = -math.inf
    logprobs = torch.log_softmax(logits, dim=-1)
    if params.greedy:
        token = int(torch.argmax(logits))
    else:
        scaled = logits / params.temperature
        if params.top_k > 0 and params.top_k < scaled.numel():
            kth = torch.topk(scaled, params.top_k).values[-1]
            scaled[scaled < kth] = -math.inf
        if params.top_p < 1.0:
            ordered, order = torch.sort(scaled, descending=True)
            cumulative = torch.softmax(ordered, dim=-1).cumsum(-1)
            # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
            drop = cumulative - torch.softmax(ordered, dim=-1) >= params.top_p
            scaled[order[drop]] = -math.inf
        probs = torch.softmax(scaled, dim=-1)
        token = int(torch.multinomial(probs, 1, generator=generator))
    top = None
    if params.logprobs is not None:
        values, indices = torch.topk(logprobs, min(params.logprobs, logprobs.numel()))
        top = {int(i): float(v) for i, v in zip(indices, values, strict=True)}
        top[token] = float(logprobs[token])
    return Choice(token, float(logprobs[token]), top)
