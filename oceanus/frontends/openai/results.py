"""A model's responses read back (the engine's typed GenerationOutput, or the vLLM backend's
output tensors), and OpenAI's logprobs and usage built from them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

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


def completion_logprobs(
    steps: list[list[tuple[str, float]]], top: int, offset: int
) -> dict[str, Any]:
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for entries in steps:
        if not entries:
            continue
        token, logprob = entries[0]
        tokens.append(token)
        token_logprobs.append(logprob)
        tops.append(dict(sorted(entries, key=lambda e: -e[1])[:top]))
        offsets.append(offset)
        offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
