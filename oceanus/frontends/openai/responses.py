"""OpenAI's Responses API: `POST /v1/responses` (whole or streamed), `GET` and `DELETE
/v1/responses/{id}`, on the chat route's machinery.

A request becomes a chat completion request: `instructions` a system message, `input` (text,
or message / `function_call` / `function_call_output` items) the messages after those of the
`previous_response_id` conversation, `tools` and `tool_choice` the chat's, `text.format` the
`response_format`, `max_output_tokens` `max_tokens`. The reply is written back as a response
object (`message` and `function_call` output items, `usage`, `status` `incomplete` when cut by
`max_output_tokens`). With `store` (the default, as OpenAI's), the response and its
conversation are kept in memory (the newest `STORE_SIZE`), for GET, DELETE and
`previous_response_id`."""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

import orjson
from pydantic import Field

from oceanus.frontends.http.infer import request_body
from oceanus.frontends.http.protocol import HttpRequest, Streamed
from oceanus.frontends.openai.errors import OpenAIError
from oceanus.frontends.openai.protocol import ChatCompletionRequest, Schema, parse
from oceanus.frontends.openai.replies import OPENAI_SHAPE, json_reply, pending, stream_reply

if TYPE_CHECKING:
    from oceanus.frontends.openai.app import OpenAIFrontend, Outcome

STORE_SIZE = 1000  # responses kept for previous_response_id, GET and DELETE (oldest go first)


class ContentPart(Schema):
    type: Literal["input_text", "output_text", "text"]
    text: str


class MessageItem(Schema):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]


class FunctionCallItem(Schema):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(Schema):
    type: Literal["function_call_output"]
    call_id: str
    output: str


Item = MessageItem | FunctionCallItem | FunctionCallOutputItem


class FunctionTool(Schema):
    type: Literal["function"]
    name: Annotated[str, Field(min_length=1)]
    description: str | None = None
    parameters: dict[str, Any] | None = None


class NamedFunction(Schema):
    type: Literal["function"]
    name: str


class TextFormat(Schema):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(Schema):
    format: TextFormat | None = None


class ResponsesRequest(Schema):
    model: Annotated[str, Field(min_length=1)]
    input: str | list[Item]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    text: TextConfig | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None


@dataclass
class _Stored:
    document: dict[str, Any]  # the response object
    messages: list[dict[str, Any]]  # the conversation through it, as chat messages


class ResponseStore:
    """The stored responses, newest last; at most `size`."""

    def __init__(self, size: int = STORE_SIZE) -> None:
        self.size = size
        self._items: OrderedDict[str, _Stored] = OrderedDict()

    def put(self, document: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        self._items[document["id"]] = _Stored(document, messages)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def get(self, response_id: str, param: str | None = None) -> _Stored:
        found = self._items.get(response_id)
        if found is None:
            message = f"Response with id '{response_id}' not found."
            raise OpenAIError(404, message, param)
        return found

    def delete(self, response_id: str) -> None:
        self.get(response_id)
        del self._items[response_id]


def route(frontend: OpenAIFrontend, request: HttpRequest, rest: list[str]) -> Outcome:

    store = frontend.responses
    if len(rest) == 1:
        if request.method == "GET":
            return json_reply(store.get(rest[0]).document)
        if request.method == "DELETE":
            store.delete(rest[0])
            return json_reply({"id": rest[0], "object": "response", "deleted": True})
        raise OpenAIError(405, f"Method Not Allowed: {request.method} {request.path}")
    if rest:
        raise OpenAIError(404, f"Not Found: {request.path}")
    if request.method != "POST":
        raise OpenAIError(405, f"Method Not Allowed: {request.method} {request.path}")
    body = parse(ResponsesRequest, request_body(request, frontend.max_input_size))
    if body.stream:
        return Streamed(stream_reply(_events(frontend, body), OPENAI_SHAPE))
    return pending(_create(frontend, body), OPENAI_SHAPE)


def _text(content: str | list[ContentPart]) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


def _conversation(store: ResponseStore, body: ResponsesRequest) -> list[dict[str, Any]]:
    """The chat messages before the instructions: the previous response's conversation, then
    this input."""
    messages: list[dict[str, Any]] = []
    if body.previous_response_id is not None:
        messages = list(store.get(body.previous_response_id, "previous_response_id").messages)
    items = [MessageItem(role="user", content=body.input)] if isinstance(body.input, str) else []
    for item in items or body.input:
        if isinstance(item, MessageItem):
            messages.append({"role": item.role, "content": _text(item.content)})
        elif isinstance(item, FunctionCallItem):
            function = {"name": item.name, "arguments": item.arguments}
            call = {"id": item.call_id, "type": "function", "function": function}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls"):
                last["tool_calls"] = [*last["tool_calls"], call]  # calls of one turn together
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
    return messages


def _chat(body: ResponsesRequest, messages: list[dict[str, Any]]) -> ChatCompletionRequest:
    if body.instructions is not None:  # not carried to the next response, as OpenAI's
        messages = [{"role": "system", "content": body.instructions}, *messages]
    document: dict[str, Any] = {"model": body.model, "messages": messages}
    if body.tools:
        document["tools"] = [
            {"type": "function", "function": tool.model_dump(exclude={"type"}, exclude_none=True)}
            for tool in body.tools
        ]
    choice = body.tool_choice
    if isinstance(choice, NamedFunction):
        document["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif choice is not None:
        document["tool_choice"] = choice
    form = body.text.format if body.text is not None else None
    if form is not None and form.type == "json_schema":
        schema = {"name": form.name or "response", "schema": form.schema_, "strict": form.strict}
        document["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif form is not None:
        document["response_format"] = {"type": form.type}
    for name, value in (
        ("max_tokens", body.max_output_tokens),
        ("temperature", body.temperature),
        ("top_p", body.top_p),
    ):
        if value is not None:
            document[name] = value
    if body.stream:
        document |= {"stream": True, "stream_options": {"include_usage": True}}
    return ChatCompletionRequest.model_validate(document)


def _response(body: ResponsesRequest, response_id: str, created: int) -> dict[str, Any]:
    """The response object, before its output."""
    form = body.text.format if body.text is not None and body.text.format else None
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "model": body.model,
        "output": [],
        "parallel_tool_calls": True,
        "previous_response_id": body.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "store": body.store,
        # As OpenAI's: the values used (1.0 when not given), not null.
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "text": {"format": form.model_dump(by_alias=True) if form else {"type": "text"}},
        "tool_choice": (
            body.tool_choice.model_dump()
            if isinstance(body.tool_choice, NamedFunction)
            else body.tool_choice or "auto"
        ),
        "tools": [tool.model_dump() for tool in body.tools or []],
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "truncation": "disabled",
        "usage": None,
        "metadata": body.metadata or {},
        # OpenAI's fields that nothing here sets (vLLM writes them too).
        "background": False,
        "max_tool_calls": None,
        "prompt": None,
        "service_tier": "auto",
        "top_logprobs": 0,
        "user": None,
    }


def _message_item(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": f"msg_{uuid.uuid4().hex}",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def _call_item(call: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{uuid.uuid4().hex}",
        "call_id": call["id"],
        "name": call["function"]["name"],
        "arguments": call["function"]["arguments"],
        "status": "completed",
    }


def _finish(
    frontend: OpenAIFrontend,
    body: ResponsesRequest,
    document: dict[str, Any],
    messages: list[dict[str, Any]],
    reply: dict[str, Any],
    usage: dict[str, int],
) -> None:
    """The response's status and usage; stored with its conversation when asked."""
    cut = reply["finish_reason"] == "length"
    document["status"] = "incomplete" if cut else "completed"
    if cut:
        document["incomplete_details"] = {"reason": "max_output_tokens"}
    document["usage"] = {
        "input_tokens": usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage["total_tokens"],
    }
    if body.store:
        said = {"role": "assistant", "content": reply["content"] or None}
        if reply["tool_calls"]:
            said["tool_calls"] = reply["tool_calls"]
        frontend.responses.put(document, [*messages, said])


async def _create(frontend: OpenAIFrontend, body: ResponsesRequest) -> dict[str, Any]:
    messages = _conversation(frontend.responses, body)
    plan, reply = await frontend.chat(_chat(body, messages))
    document = _response(body, f"resp_{uuid.uuid4().hex}", plan.created)
    choice = reply["choices"][0]
    message = choice["message"]
    if message.get("content"):
        document["output"].append(_message_item(message["content"]))
    calls = message.get("tool_calls") or []
    document["output"] += [_call_item(call) for call in calls]
    said = {"content": message.get("content"), "tool_calls": calls}
    said["finish_reason"] = choice["finish_reason"]
    _finish(frontend, body, document, messages, said, reply["usage"])
    return document


async def _events(frontend: OpenAIFrontend, body: ResponsesRequest) -> AsyncGenerator[bytes, None]:
    """The Responses API's stream: response.created and .in_progress, then per output item
    .output_item.added, its text (.content_part.added, .output_text.delta ..., .done) or its
    call's arguments, .output_item.done, and response.completed with the whole response."""
    messages = _conversation(frontend.responses, body)
    plan, chunks = await frontend.chat_chunks(_chat(body, messages))
    document = _response(body, f"resp_{uuid.uuid4().hex}", plan.created)
    sequence = 0

    def event(kind: str, fields: dict[str, Any]) -> bytes:
        nonlocal sequence
        data = orjson.dumps({"type": kind, "sequence_number": sequence, **fields})
        sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"

    text: dict[str, Any] | None = None  # the message item being written
    said: dict[str, Any] = {"content": "", "tool_calls": [], "finish_reason": None}
    usage: dict[str, int] = {}
    output = document["output"]
    try:
        async for chunk in chunks:
            if sequence == 0:
                yield event("response.created", {"response": document})
                yield event("response.in_progress", {"response": document})
            usage = chunk.get("usage") or usage
            for choice in chunk["choices"]:
                delta = choice["delta"]
                if delta.get("content"):
                    if text is None:
                        text = _message_item("")
                        text["status"] = "in_progress"
                        output.append(text)
                        for part in _text_start(event, text, len(output) - 1):
                            yield part
                    said["content"] += delta["content"]
                    place = _place(text, len(output) - 1)
                    yield event("response.output_text.delta", {**place, "delta": delta["content"]})
                for call in delta.get("tool_calls") or []:
                    if text is not None:
                        for part in _text_end(event, text, output.index(text), said["content"]):
                            yield part
                        text = None
                    said["tool_calls"].append(call)
                    item = _call_item(call)
                    output.append(item)
                    index = len(output) - 1
                    yield event("response.output_item.added", {"output_index": index, "item": item})
                    done = {"item_id": item["id"], "output_index": index}
                    delta_event = {**done, "delta": item["arguments"]}
                    yield event("response.function_call_arguments.delta", delta_event)
                    done |= {"arguments": item["arguments"], "name": item["name"]}
                    yield event("response.function_call_arguments.done", done)
                    yield event("response.output_item.done", {"output_index": index, "item": item})
                said["finish_reason"] = choice["finish_reason"] or said["finish_reason"]
    finally:
        await chunks.aclose()
    if text is not None:
        for part in _text_end(event, text, output.index(text), said["content"]):
            yield part
    _finish(frontend, body, document, messages, said, usage or _no_usage())
    final = "response.incomplete" if document["status"] == "incomplete" else "response.completed"
    yield event(final, {"response": document})


def _no_usage() -> dict[str, int]:
    return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}


def _place(item: dict[str, Any], index: int) -> dict[str, Any]:
    return {"item_id": item["id"], "output_index": index, "content_index": 0, "logprobs": []}


def _text_start(event: Any, item: dict[str, Any], index: int) -> list[bytes]:
    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    place = {"item_id": item["id"], "output_index": index, "content_index": 0}
    return [
        event("response.output_item.added", {"output_index": index, "item": item}),
        event("response.content_part.added", {**place, "part": part}),
    ]


def _text_end(event: Any, item: dict[str, Any], index: int, text: str) -> list[bytes]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    item["content"] = [part]
    item["status"] = "completed"
    place = {"item_id": item["id"], "output_index": index, "content_index": 0}
    return [
        event("response.output_text.done", {**place, "text": text, "logprobs": []}),
        event("response.content_part.done", {**place, "part": part}),
        event("response.output_item.done", {"output_index": index, "item": item}),
    ]
