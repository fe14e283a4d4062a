"""Anthropic's Messages API: `POST /v1/messages` (whole or streamed) and `POST
/v1/messages/count_tokens`, in Anthropic's shapes, on the chat route's machinery.

A request becomes a chat completion request (system -> a system message; `tool_use` blocks ->
an assistant's `tool_calls`; `tool_result` blocks -> `tool` messages; `tool_choice` any ->
required, tool -> named), planned and generated as the chat route does (the model's template,
tokenizer, tool-call parser and grammars), and the reply is written back as Anthropic's
message: text and `tool_use` content blocks, `stop_reason`, `usage`. Errors are Anthropic's
`{"type": "error", "error": {"type", "message"}}`."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Annotated, Any, Literal

import orjson
from pydantic import Field

from oceanus.frontends.http.infer import request_body
from oceanus.frontends.http.protocol import HttpRequest, HttpResponse, Streamed
from oceanus.frontends.openai.errors import JSON, OpenAIError, as_openai_error, bad_request
from oceanus.frontends.openai.protocol import ChatCompletionRequest, Schema, parse
from oceanus.frontends.openai.replies import pending, stream_reply

if TYPE_CHECKING:
    from oceanus.frontends.openai.app import OpenAIFrontend, Outcome

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error"}
_ERROR_TYPES |= {403: "permission_error", 404: "not_found_error", 405: "invalid_request_error"}
_ERROR_TYPES |= {413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


class TextBlock(Schema):
    type: Literal["text"]
    text: str


class ToolUseBlock(Schema):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(Schema):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: bool | None = None


Block = Annotated[TextBlock | ToolUseBlock | ToolResultBlock, Field(discriminator="type")]


class AnthropicMessage(Schema):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class AnthropicTool(Schema):
    name: Annotated[str, Field(min_length=1)]
    description: str | None = None
    input_schema: dict[str, Any]


class AnthropicToolChoice(Schema):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None


class CountTokensRequest(Schema):
    model: Annotated[str, Field(min_length=1)]
    messages: Annotated[list[AnthropicMessage], Field(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: Annotated[int, Field(ge=1)]
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None


class _AnthropicShape:
    def document(self, exc: BaseException) -> tuple[int, dict[str, Any]]:
        error = as_openai_error(exc)
        kind = _ERROR_TYPES.get(error.status, "api_error")
        return error.status, {"type": "error", "error": {"type": kind, "message": error.message}}

    def reply(self, exc: BaseException) -> HttpResponse:
        status, document = self.document(exc)
        return HttpResponse(status, orjson.dumps(document), [(b"content-type", JSON)])

    def event(self, exc: BaseException) -> bytes:
        return _event("error", self.document(exc)[1])


SHAPE = _AnthropicShape()


def route(frontend: OpenAIFrontend, request: HttpRequest, rest: list[str]) -> Outcome:

    if rest not in ([], ["count_tokens"]):
        raise OpenAIError(404, f"Not Found: {request.path}")
    if request.method != "POST":
        raise OpenAIError(405, f"Method Not Allowed: {request.method} {request.path}")
    data = request_body(request, frontend.max_input_size)
    if rest:
        return pending(_count_tokens(frontend, parse(CountTokensRequest, data)), SHAPE)
    body = parse(MessagesRequest, data)
    if body.stream:
        return Streamed(stream_reply(_events(frontend, body), SHAPE))
    return pending(_create(frontend, body), SHAPE)


def _text(content: str | list[TextBlock]) -> str:
    return content if isinstance(content, str) else "".join(b.text for b in content)


def _messages(body: CountTokensRequest) -> list[dict[str, Any]]:
    """Anthropic's messages as the chat route's."""
    found: list[dict[str, Any]] = []
    if body.system is not None:
        found.append({"role": "system", "content": _text(body.system)})
    for message in body.messages:
        if isinstance(message.content, str):
            found.append({"role": message.role, "content": message.content})
            continue
        text, calls = "", []
        for block in message.content:
            if isinstance(block, TextBlock):
                text += block.text
            elif isinstance(block, ToolUseBlock):
                function = {"name": block.name, "arguments": json.dumps(block.input)}
                calls.append({"id": block.id, "type": "function", "function": function})
            else:  # a tool's result: a tool message, in its place
                found.append(
                    {
                        "role": "tool",
                        "tool_call_id": block.tool_use_id,
                        "content": _text(block.content),
                    }
                )
        if message.role == "assistant" and calls:
            found.append({"role": "assistant", "content": text or None, "tool_calls": calls})
        elif text or message.role == "assistant":
            found.append({"role": message.role, "content": text})
    return found


def _chat(body: CountTokensRequest, stream: bool = False) -> ChatCompletionRequest:
    document: dict[str, Any] = {"model": body.model, "messages": _messages(body)}
    if body.tools:
        document["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description or "",
                    "parameters": tool.input_schema,
                },
            }
            for tool in body.tools
        ]
    choice = body.tool_choice
    if choice is not None and body.tools:
        if choice.type == "tool":
            if not choice.name:
                raise bad_request("'tool_choice.name' is required for type 'tool'", "tool_choice")
            document["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
        else:
            document["tool_choice"] = {"any": "required"}.get(choice.type, choice.type)
    if isinstance(body, MessagesRequest):
        document["max_tokens"] = body.max_tokens
        for name in ("temperature", "top_p", "top_k"):
            if (value := getattr(body, name)) is not None:
                document[name] = value
        if body.stop_sequences:
            document["stop"] = body.stop_sequences
        if stream:
            document |= {"stream": True, "stream_options": {"include_usage": True}}
    return ChatCompletionRequest.model_validate(document)


async def _count_tokens(frontend: OpenAIFrontend, body: CountTokensRequest) -> dict[str, Any]:
    plan, _ = await frontend.plan(_chat(body))
    tokens = plan.prompts[0].tokens or 0
    # context_management as vLLM's (nothing is trimmed here: the same count)
    return {"input_tokens": tokens, "context_management": {"original_input_tokens": tokens}}


def _content(message: dict[str, Any]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        blocks.append(_tool_use(call))
    return blocks


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    function = call["function"]
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:
        arguments = {}
    return {
        "type": "tool_use",
        "id": "toolu_" + call["id"].removeprefix("call_"),
        "name": function["name"],
        "input": arguments if isinstance(arguments, dict) else {},
    }


def _message_head(model: str) -> dict[str, Any]:
    return {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
    }


async def _create(frontend: OpenAIFrontend, body: MessagesRequest) -> dict[str, Any]:
    _, reply = await frontend.chat(_chat(body))
    choice, usage = reply["choices"][0], reply["usage"]
    return {
        **_message_head(body.model),
        "content": _content(choice["message"]),
        "stop_reason": _STOP_REASONS.get(choice["finish_reason"], "end_turn"),
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "output_tokens": usage["completion_tokens"],
        },
    }


def _event(kind: str, document: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(document) + b"\n\n"


async def _events(frontend: OpenAIFrontend, body: MessagesRequest) -> AsyncGenerator[bytes, None]:
    """Anthropic's stream: message_start, a content block per text run and per tool call
    (content_block_start / _delta / _stop), message_delta (stop_reason, usage), message_stop."""
    plan, chunks = await frontend.chat_chunks(_chat(body, stream=True))
    message = _message_head(body.model)
    message["usage"] = {"input_tokens": plan.prompts[0].tokens or 0, "output_tokens": 0}
    index, open_text, stop, output = 0, False, "end_turn", 0
    started = False
    try:
        async for chunk in chunks:
            if not started:
                yield _event("message_start", {"type": "message_start", "message": message})
                started = True
            if chunk.get("usage"):
                output = chunk["usage"]["completion_tokens"]
            for choice in chunk["choices"]:
                delta = choice["delta"]
                if delta.get("content"):
                    if not open_text:
                        yield _block_start(index, {"type": "text", "text": ""})
                        open_text = True
                    text_delta = {"type": "text_delta", "text": delta["content"]}
                    yield _block_delta(index, text_delta)
                for call in delta.get("tool_calls") or []:
                    if open_text:
                        yield _block_stop(index)
                        index, open_text = index + 1, False
                    block = _tool_use(call)
                    arguments = json.dumps(block["input"])
                    yield _block_start(index, {**block, "input": {}})
                    yield _block_delta(
                        index, {"type": "input_json_delta", "partial_json": arguments}
                    )
                    yield _block_stop(index)
                    index += 1
                if choice.get("finish_reason"):
                    stop = _STOP_REASONS.get(choice["finish_reason"], "end_turn")
    finally:
        await chunks.aclose()
    if open_text:
        yield _block_stop(index)
    delta = {"stop_reason": stop, "stop_sequence": None}
    end = {"type": "message_delta", "delta": delta, "usage": {"output_tokens": output}}
    yield _event("message_delta", end)
    yield _event("message_stop", {"type": "message_stop"})


def _block_start(index: int, block: dict[str, Any]) -> bytes:
    start = {"type": "content_block_start", "index": index, "content_block": block}
    return _event("content_block_start", start)


def _block_delta(index: int, delta: dict[str, Any]) -> bytes:
    document = {"type": "content_block_delta", "index": index, "delta": delta}
    return _event("content_block_delta", document)


def _block_stop(index: int) -> bytes:
    return _event("content_block_stop", {"type": "content_block_stop", "index": index})
