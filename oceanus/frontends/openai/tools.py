"""Tool calls in a model's text, in the formats of the common model families.

- `hermes` (Hermes, Qwen 2/2.5/3): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
- `llama3_json` (Llama 3.1+): the reply is `{"name": ..., "parameters": {...}}` (optionally
  after `<|python_tag|>`; several separated by `;`)
- `mistral`: `[TOOL_CALLS]` then a JSON list of `{"name", "arguments"}`

The parser is chosen per model: its config's `tool_call_parser` parameter, else the one whose
marker its chat template writes (`parser_for_template`).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON object as text, as OpenAI sends it

    def document(self, index: int | None = None) -> dict[str, Any]:
        call: dict[str, Any] = {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        if index is not None:
            call = {"index": index, **call}
        return call


def _call(item: Any, argument_keys: tuple[str, ...] = ("arguments", "parameters")) -> ToolCall:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise ValueError("not a tool call")
    arguments: Any = {}
    for key in argument_keys:
        if key in item:
            arguments = item[key]
            break
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ToolCall(item["name"], text)


class Parser:
    """Splits a reply into content and tool calls; `start` is where calls may begin."""

    name = ""
    marker = ""

    def start(self, text: str) -> int:
        """The offset in `text` where a tool call begins (-1: none yet)."""
        return text.find(self.marker)

    def hold(self, text: str) -> int:
        """How much of the end of `text` a stream holds back: it may begin a call."""
        return held_back(text, self.marker)

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        raise NotImplementedError


class HermesParser(Parser):
    name = "hermes"
    marker = "<tool_call>"
    _pattern = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        calls = []
        for body in self._pattern.findall(text):
            try:
                calls.append(_call(json.loads(body)))
            except ValueError:
                return text, []  # not well-formed: the reply stays text
        if not calls:
            return text, []
        content = text[: text.find(self.marker)].strip()
        return content or None, calls


class Llama3JsonParser(Parser):
    name = "llama3_json"
    marker = "<|python_tag|>"

    def start(self, text: str) -> int:
        stripped = text.lstrip()
        if stripped.startswith(self.marker) or stripped.startswith("{"):
            return len(text) - len(stripped)
        return -1

    def hold(self, text: str) -> int:
        stripped = text.lstrip()
        return len(text) if self.marker.startswith(stripped) else 0

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        body = text.strip()
        body = body.removeprefix(self.marker).strip()
        if not body.startswith("{"):
            return text, []
        decoder, calls, offset = json.JSONDecoder(), [], 0
        try:
            while offset < len(body):
                item, end = decoder.raw_decode(body, offset)
                calls.append(_call(item, ("parameters", "arguments")))
                offset = end
                while offset < len(body) and body[offset] in " \n\t;":
                    offset += 1
        except ValueError:
            return text, []
        return None, calls


class MistralParser(Parser):
    name = "mistral"
    marker = "[TOOL_CALLS]"

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        at = text.find(self.marker)
        if at < 0:
            return text, []
        try:
            items, _ = json.JSONDecoder().raw_decode(text[at + len(self.marker) :].strip())
            items = items if isinstance(items, list) else [items]
            calls = [_call(item) for item in items]
        except ValueError:
            return text, []
        return text[:at].strip() or None, calls


PARSERS: dict[str, type[Parser]] = {
    p.name: p for p in (HermesParser, Llama3JsonParser, MistralParser)
}


def parser_for_template(template: str | None) -> Parser | None:
    """The parser whose format a chat template writes (None: no known format)."""
    if not template:
        return None
    if "<tool_call>" in template:
        return HermesParser()
    if "[TOOL_CALLS]" in template:
        return MistralParser()
    if "<|python_tag|>" in template or "ipython" in template:
        return Llama3JsonParser()
    return None


def named_call(name: str, text: str) -> ToolCall:
    """tool_choice naming a function: the whole reply is that function's arguments."""
    return ToolCall(name, text.strip())


def held_back(text: str, marker: str) -> int:
    """How many characters at the end of `text` could be the start of `marker` (a stream holds
    them back until it knows)."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
