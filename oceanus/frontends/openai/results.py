"""A model's responses read back (the engine's typed GenerationOutput, or the vLLM backend's
output tensors), and OpenAI's logprobs and usage built from them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from oceanus.core.generation import PromptLogprob
from oceanus.core.types import InferResponse


@dataclass(slots=True)
class Piece:
    """One response of the model: new text, and what came with it."""

    text: str = ""
    finish_reason: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    # Per token: (text, logprob) of the chosen token first, then the alternatives by rank.
    logprobs: list[list[tuple[str, float]]] = field(default_factory=list)
    prompt_logprobs: list[list[PromptLogprob]] | None = None  # the engine's, in its first piece


def _scalar(data: Any) -> Any:
    flat = data.reshape(-1)
    return flat[0] if flat.size else None


_PARTIAL = "\ufffd"


class WholeCharacters:
    """Text that ends inside a UTF-8 character (its bytes decode to U+FFFD) is held back until
    the next piece completes it, and dropped when the reply ends there (cut by max_tokens), as
    vLLM's detokenizer does: a client never reads a U+FFFD that a later byte would undo."""

    def __init__(self) -> None:
        self.held: dict[int, str] = {}

    def __call__(self, index: int, piece: Piece) -> Piece:
        text = self.held.pop(index, "") + piece.text
        whole = text.rstrip(_PARTIAL)
        if piece.finish_reason is None and whole != text:
            self.held[index] = text[len(whole) :]
        piece.text = whole
        return piece


def read(response: InferResponse) -> Piece:
    typed = response.generation
    if typed is not None:
        return Piece(
            typed.text,
            typed.finish_reason,
            typed.num_input_tokens,
            typed.num_output_tokens,
            typed.logprobs or [],
            typed.prompt_logprobs,
        )
    piece = Piece()
    for tensor in response.outputs:
        value = _scalar(tensor.data)
        if value is None:
            continue
        name = tensor.name
        if name == "text_output":
            piece.text = "".join(
                v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
                for v in tensor.data.reshape(-1)
            )
        elif name == "finish_reason":
            reason = value.decode() if isinstance(value, bytes) else str(value)
            piece.finish_reason = None if reason in ("None", "") else reason
        elif name == "num_input_tokens":
            piece.input_tokens = int(value)
        elif name == "num_output_tokens":
            piece.output_tokens = int(value)
        elif name == "logprobs":
            text = value.decode() if isinstance(value, bytes) else str(value)
            steps = json.loads(text) if text and text != "null" else None
            piece.logprobs = [_entries(step) for step in steps] if isinstance(steps, list) else []
    return piece


def _entries(step: dict[str, Any]) -> list[tuple[str, float]]:
    """(token text, logprob) of one step; the chosen token first (the engine writes it first),
    the others by rank."""
    items = list(step.values())
    chosen, others = items[:1], sorted(items[1:], key=lambda e: e.get("rank") or 0)
    return [
        (str(e.get("decoded_token") or ""), float(e.get("logprob", 0.0))) for e in chosen + others
    ]


def chat_logprobs(steps: list[list[tuple[str, float]]], top: int) -> dict[str, Any]:
    content = []
    for entries in steps:
        if not entries:
            continue
        token, logprob = entries[0]
        ranked = sorted(entries, key=lambda e: -e[1])[:top]
        content.append(
            {
                "token": token,
                "logprob": logprob,
                "bytes": list(token.encode()),
                "top_logprobs": [
                    {"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in ranked
                ],
            }
        )
    return {"content": content}


# Steps of completions' logprobs: (text, logprob) of the token, then its alternatives; None:
# the first prompt token's, which nothing predicts.
Steps = list[list[tuple[str, float | None]]]


def prompt_steps(entries: list[list[PromptLogprob]], top: int) -> Steps:
    """The engine's prompt logprobs as completions' steps, each with the prompt's token and
    the `top` likeliest (as vLLM's: top + 1 entries when the token is not among them)."""
    return [
        [
            (text, logprob)
            for number, (_, text, logprob, rank) in enumerate(step)
            if number == 0 or (rank is not None and rank <= top)
        ]
        for step in entries
    ]


def _clamp(logprob: float) -> float:
    """-inf (a banned token) as OpenAI writes it in JSON, as vLLM does."""
    return max(logprob, -9999.0)


def completion_logprobs(steps: Steps, offset: int) -> dict[str, Any]:
    """OpenAI's completions logprobs; `text_offset` counts from `offset` by each token's text
    (vLLM's way: an echoed prompt's special tokens count too)."""
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    for entries in steps:
        if not entries:
            continue
        token, logprob = entries[0]
        tokens.append(token)
        offsets.append(offset)
        offset += len(token)
        if logprob is None:
            token_logprobs.append(None)
            tops.append(None)
            continue
        token_logprobs.append(_clamp(logprob))
        # the chosen token and the alternatives the engine sent (the `logprobs` likeliest)
        tops.append({t: _clamp(lp) for t, lp in entries if lp is not None})
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def prompt_logprobs(entries: list[list[PromptLogprob]] | None, top: int) -> list[Any] | None:
    """vLLM's `prompt_logprobs` field: None for the first token, then per token {id: {logprob,
    rank, decoded_token}}, the prompt's token first, with the `top` likeliest."""
    if entries is None:
        return None
    shown: list[Any] = []
    for number, step in enumerate(entries):
        if number == 0:
            shown.append(None)
            continue
        shown.append(
            {
                str(token): {"logprob": _clamp(lp or 0.0), "rank": rank, "decoded_token": text}
                for index, (token, text, lp, rank) in enumerate(step)
                if index == 0 or (rank is not None and rank <= top)
            }
        )
    return shown


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
