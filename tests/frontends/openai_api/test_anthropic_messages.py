"""Anthropic's Messages API through the official `anthropic` client: a scripted conversation
with a tool call parsed and its result sent back, streaming, count_tokens, errors."""

from __future__ import annotations

import json
from typing import Any

import pytest

anthropic = pytest.importorskip("anthropic")

from tests.frontends.openai_api.conftest import WEATHER  # noqa: E402

TOOL = {"name": "weather", "description": "The weather in a city", "input_schema": WEATHER}


def test_a_tool_loop(client_of: Any) -> None:
    """The model has random weights: the named tool's grammar makes its reply a valid call."""
    client = client_of("anthropic")
    pytest.importorskip("llguidance")
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    reply = client.messages.create(
        model="llm",
        max_tokens=40,
        system="You are terse.",
        messages=ask,
        tools=[TOOL],
        tool_choice={"type": "tool", "name": "weather"},
    )
    assert reply.type == "message" and reply.role == "assistant"
    (use,) = [block for block in reply.content if block.type == "tool_use"]
    assert use.name == "weather" and isinstance(use.input["city"], str)
    assert reply.stop_reason == "tool_use", reply
    assert reply.usage.input_tokens > 0 and reply.usage.output_tokens > 0
    ask += [
        {"role": "assistant", "content": [block.model_dump() for block in reply.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": "sunny"},
                {"type": "text", "text": "And so?"},
            ],
        },
    ]
    after = client.messages.create(
        model="llm", max_tokens=5, messages=ask, tools=[TOOL], extra_body={"temperature": 0}
    )
    assert after.stop_reason in ("max_tokens", "end_turn", "tool_use")


def test_stream_equals_whole_reply(client_of: Any) -> None:
    client = client_of("anthropic")
    # (this client's signature has no sampling parameters: they go as extra fields)
    ask: dict[str, Any] = {"model": "llm", "max_tokens": 8, "extra_body": {"temperature": 0}}
    ask["messages"] = [{"role": "user", "content": "Hello"}]
    whole = client.messages.create(**ask)
    kinds = []
    with client.messages.stream(**ask) as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_delta" in kinds and "message_delta" in kinds
    text = "".join(b.text for b in final.content if b.type == "text")
    assert text == "".join(b.text for b in whole.content if b.type == "text")
    assert final.stop_reason == whole.stop_reason == "max_tokens"
    assert final.usage.output_tokens == whole.usage.output_tokens == 8


def test_count_tokens_and_errors(client_of: Any) -> None:
    client = client_of("anthropic")
    messages = [{"role": "user", "content": "Hello there"}]
    counted = client.messages.count_tokens(model="llm", messages=messages)
    reply = client.messages.create(model="llm", max_tokens=1, messages=messages)
    assert counted.input_tokens == reply.usage.input_tokens > 0
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="llm", max_tokens=0, messages=messages)
    body = caught.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="nope", max_tokens=1, messages=messages)
    assert missing.value.body["error"]["type"] == "not_found_error"
    too_long = client.messages.stream(model="llm", max_tokens=10_000, messages=messages)
    with pytest.raises(anthropic.BadRequestError), too_long as stream:  # before the head
        list(stream)
    assert json.dumps(body)
