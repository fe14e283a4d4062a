"""Reasoning ("thinking") set apart from a chat reply, as vLLM's `--reasoning-parser` does:
the text between `<think>` and `</think>` comes back as `reasoning_content` (in the message,
and as `delta.reasoning_content` in a stream, before the `delta.content` that follows), with
the tags removed from `content`.

Chosen per model: `oceanus serve --reasoning-parser NAME`, or the config's
`parameters { key: "reasoning_parser" value { string_value: "deepseek_r1" } }`.

- `deepseek_r1`: the reply is reasoning up to `</think>` (its chat template writes `<think>` into
  the prompt, so the reply may not start with it); a reply without `</think>` is all reasoning
  (as vLLM's parser reads it).
- `qwen3`: reasoning only when the reply starts with `<think>`; a reply that does not is all
  content (Qwen3 with thinking switched off). A reply cut inside its thinking is all reasoning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from oceanus.frontends.openai.errors import OpenAIError
from oceanus.frontends.openai.tools import held_back

START, END = "<think>", "</think>"


@dataclass(frozen=True)
class ReasoningParser:
    name: str
    # Whether a reply that does not start with <think> is reasoning (until </think>).
    implicit_start: bool

    def split(self, text: str, final: bool = True) -> tuple[str, str | None]:
        """(reasoning so far, content so far) of a reply's text. Before the end (`final`
        false) text that may still become a tag is left out of both (a stream holds it back);
        content is None while the reply is still in its reasoning."""
        stripped = text.lstrip()
        if not final and not stripped:
            return "", None  # nothing yet (or blanks before a start tag)
        if stripped.startswith(START):
            body = stripped[len(START) :]
        elif not final and START.startswith(stripped):
            return "", None  # may be the start tag: wait
        elif self.implicit_start:
            body = text
        else:
            return "", text  # not thinking: all content
        end = body.find(END)
        if end >= 0:
            return body[:end], body[end + len(END) :]
        if final:
            return body, None
        return body[: len(body) - held_back(body, END)], None


PARSERS: dict[str, ReasoningParser] = {
    "deepseek_r1": ReasoningParser("deepseek_r1", implicit_start=True),
    "qwen3": ReasoningParser("qwen3", implicit_start=False),
}


def parser_for_config(config: Any) -> ReasoningParser | None:
    """The model config's `reasoning_parser` parameter (`oceanus serve --reasoning-parser`)."""
    chosen = config.parameters.get("reasoning_parser")
    name = chosen.string_value if chosen is not None else ""
    if not name:
        return None
    if name not in PARSERS:
        known = ", ".join(sorted(PARSERS))
        raise OpenAIError(500, f"unknown reasoning_parser {name!r} in the model's config: {known}")
    return PARSERS[name]


class ReasoningStream:
    """What a streaming choice has sent of its reasoning: each new text gives the reasoning to
    send now, and the content so far (for the content and tool-call stream)."""

    def __init__(self, parser: ReasoningParser) -> None:
        self.parser = parser
        self.sent = 0

    def feed(self, text: str, final: bool) -> tuple[str, str]:
        reasoning, content = self.parser.split(text, final)
        delta = reasoning[self.sent :] if len(reasoning) > self.sent else ""
        self.sent = max(self.sent, len(reasoning))
        return delta, content or ""
