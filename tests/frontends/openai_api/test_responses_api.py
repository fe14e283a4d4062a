"""OpenAI's Responses API through the official `openai` client's `responses` resource: a
scripted tool loop (the call parsed, its output sent back with previous_response_id), streaming
events, json_schema output, the store (GET, DELETE, store: false)."""

from __future__ import annotations

import json
from typing import Any

import pytest

openai = pytest.importorskip("openai")

from tests.frontends.openai_api.conftest import WEATHER  # noqa: E402

TOOL = {"type": "function", "name": "weather", "parameters": WEATHER}


def test_a_tool_loop_with_the_store(client_of: Any) -> None:
    """Random weights: the named tool's grammar makes the reply a valid call."""
    client = client_of("openai")
    pytest.importorskip("llguidance")
    first = client.responses.create(
        model="llm",
        instructions="You are terse.",
        input="Weather in Paris?",
        tools=[TOOL],
        tool_choice={"type": "function", "name": "weather"},
        max_output_tokens=40,
    )
    assert first.object == "response" and first.status == "completed", first
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "weather" and isinstance(json.loads(call.arguments)["city"], str)
    assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0
    second = client.responses.create(
        model="llm",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        max_output_tokens=4,
        temperature=0,
    )
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.input_tokens  # the conversation grew
    assert second.status == "incomplete" and second.incomplete_details.reason == "max_output_tokens"
    assert client.responses.retrieve(first.id).id == first.id
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model="llm", input="x", previous_response_id=first.id)
    assert caught.value.body["param"] == "previous_response_id"
    unstored = client.responses.create(model="llm", input="x", max_output_tokens=1, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_stream_events_and_text(client_of: Any) -> None:
    client = client_of("openai")
    ask: dict[str, Any] = {"model": "llm", "input": "Hello", "max_output_tokens": 8}
    ask["temperature"] = 0
    whole = client.responses.create(**ask)
    events = list(client.responses.create(**ask, stream=True))
    kinds = [event.type for event in events]
    assert kinds[:3] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
    ]
    assert "response.output_text.delta" in kinds and "response.output_text.done" in kinds
    assert kinds[-1] == "response.incomplete"  # cut by max_output_tokens
    assert [event.sequence_number for event in events] == list(range(len(events)))
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == whole.output_text
    final = events[-1].response
    assert final.output_text == whole.output_text
    assert final.usage.output_tokens == whole.usage.output_tokens == 8


def test_json_schema_format(client_of: Any) -> None:
    client = client_of("openai")
    pytest.importorskip("llguidance")
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    reply = client.responses.create(
        model="llm",
        input="Is it?",
        text={"format": {"type": "json_schema", "name": "answer", "schema": schema}},
        max_output_tokens=30,
    )
    assert isinstance(json.loads(reply.output_text)["ok"], bool)
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="llm", input=[{"type": "nope"}])
    assert caught.value.body["param"] == "input"
