"""What the LLM tests share: the prompts they send (short and long: the long ones prefill over
several chunks when the engine's prefill budget is small, one of them code), a request's sink
(Collect) and the check of bfloat16 output against transformers' logits."""

from __future__ import annotations

import math
import threading
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from oceanus.backends.llm.scheduler import StepOutput
from oceanus.examples.llm import cached_llm


class Collect:
    """A sink per request: its outputs, and an event set by the last."""

    def __init__(self) -> None:
        self.outputs: list[StepOutput] = []
        self.done = threading.Event()

    def __call__(self, out: StepOutput) -> None:
        self.outputs.append(out)
        if out.finished:
            self.done.set()

    def wait(self) -> list[StepOutput]:
        assert self.done.wait(60)
        return self.outputs

    @property
    def tokens(self) -> list[int]:
        return [t for out in self.outputs for t in out.token_ids]

    @property
    def text(self) -> str:
        return "".join(out.text for out in self.wait())


PROMPTS = [
    "The ocean covers",
    "Hello world! How are you today? I am fine, thank you. What is the weather like",
    "def main(): return",
    "Tides rise and fall twice a day, pulled by the moon and the sun. Waves carry energy",
]


def worst_margin_in_ulps(prompts: list[list[int]], tokens: list[list[int]], dtype: Any) -> float:
    """Teacher-forced through transformers in `dtype`: how far below the largest logit each of
    our greedy tokens' logit lies, in bfloat16 ulps of that largest logit (0: every token is
    transformers' own argmax; bfloat16 keeps 8 significant bits, so 1 ulp is 1/128 to 1/256 of
    the value)."""
    model = AutoModelForCausalLM.from_pretrained(cached_llm("tiny"), dtype=dtype).eval()
    worst = 0.0
    for ids, ours in zip(prompts, tokens, strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([ids + ours])).logits[0, len(ids) - 1 : -1].float()
        top = logits.max(dim=1).values
        chosen = logits.gather(1, torch.tensor(ours)[:, None])[:, 0]
        for best, got in zip(top.tolist(), chosen.tolist(), strict=True):
            ulp = 2.0 ** (math.floor(math.log2(abs(best))) - 7)
            worst = max(worst, (best - got) / ulp)
    return worst
