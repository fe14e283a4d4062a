"""The OpenAI-compatible API through the official `openai` client (sync, async, streaming),
unchanged apart from `base_url`, against the real server on loopback.

The model is the toy model with the vLLM backend's tensors (oceanus/examples/toy_llm): it says
what the last message asks it to (`SAY:...`), so every reply here is known in advance. One
server for the module, with `--openai-port` and the inference API restricted to a header the
clients send, so the restricted-API check runs on every call.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("tokenizers")

from oceanus.examples.toy_llm import CONTEXT_LENGTH, write_toy_llm  # noqa: E402
from tests.conftest import ServerProcess, free_port  # noqa: E402

HEADER = {"x-inference-key": "open-sesame"}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, int]]:
    repository = tmp_path_factory.mktemp("openai_repository")
    write_toy_llm(repository, delay_s=0.002)
    openai_port = free_port()
    process = ServerProcess(
        [repository],
        [
            f"--openai-port={openai_port}",
            "--http-restricted-api=inference:x-inference-key=open-sesame",
        ],
    )
    try:
        process.wait_live()
        yield process, openai_port
    finally:
        process.stop()


@pytest.fixture(scope="module")
def client(served: tuple[ServerProcess, int]) -> Any:
    process, _ = served
    return openai.OpenAI(
        base_url=f"http://{process.http_url}/v1", api_key="unused", default_headers=HEADER
    )


def _say(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"SAY:{text}"}]


def test_models_listed_and_found(client: Any, served: tuple[ServerProcess, int]) -> None:
    assert [m.id for m in client.models.list().data] == ["toy_llm"]
    assert client.models.retrieve("toy_llm").id == "toy_llm"
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("no_such_model")
    assert caught.value.body["code"] == "model_not_found"
    # The same routes on --openai-port.
    _, port = served
    own = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", default_headers=HEADER)
    assert [m.id for m in own.models.list().data] == ["toy_llm"]
    reply = own.chat.completions.create(model="toy_llm", messages=_say("port"))
    assert reply.choices[0].message.content == "port"


def test_chat_reply_usage_and_length(client: Any) -> None:
    reply = client.chat.completions.create(model="toy_llm", messages=_say("Hello, how are you?"))
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == "Hello, how are you?"
    assert choice.finish_reason == "stop"
    assert reply.object == "chat.completion" and reply.model == "toy_llm"
    assert reply.usage.completion_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    cut = client.chat.completions.create(
        model="toy_llm", messages=_say("one two three four five"), max_completion_tokens=2
    )
    assert cut.choices[0].finish_reason == "length" and cut.usage.completion_tokens == 2


def test_default_max_tokens_is_what_the_context_leaves(client: Any) -> None:
    reply = client.chat.completions.create(model="toy_llm", messages=_say("FOREVER"))
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.total_tokens == CONTEXT_LENGTH  # not OpenAI's old default of 16


def test_prompt_longer_than_the_context_is_a_400_naming_both(client: Any) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="toy_llm", messages=_say("la " * 400))
    message = caught.value.body["message"]
    assert f"maximum context length is {CONTEXT_LENGTH} tokens" in message
    assert "resulted in" in message and caught.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="toy_llm", messages=_say("x"), max_tokens=10_000)
    assert "10000 in the completion" in caught.value.body["message"]


def test_chat_stream_with_usage(client: Any) -> None:
    stream = client.chat.completions.create(
        model="toy_llm",
        messages=_say("streamed words here"),
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "streamed words here"
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_stop_strings_logprobs_and_n(client: Any) -> None:
    reply = client.chat.completions.create(
        model="toy_llm",
        messages=_say("alpha beta gamma"),
        stop=[" gamma"],
        n=2,
        logprobs=True,
        top_logprobs=1,
    )
    assert [c.message.content for c in reply.choices] == ["alpha beta", "alpha beta"]
    assert [c.index for c in reply.choices] == [0, 1]
    tokens = reply.choices[0].logprobs.content
    assert "".join(t.token for t in tokens).startswith("alpha beta")
    assert all(t.logprob == 0.0 and len(t.top_logprobs) == 1 for t in tokens)


def test_async_client_concurrent_chats(served: tuple[ServerProcess, int]) -> None:
    process, _ = served

    async def main() -> list[str]:
        client = openai.AsyncOpenAI(
            base_url=f"http://{process.http_url}/v1", api_key="x", default_headers=HEADER
        )
        async with client:
            replies = await asyncio.gather(
                *(
                    client.chat.completions.create(model="toy_llm", messages=_say(f"number {i}"))
                    for i in range(6)
                )
            )
            stream = await client.chat.completions.create(
                model="toy_llm", messages=_say("async stream"), stream=True
            )
            streamed = "".join([c.choices[0].delta.content or "" async for c in stream])
        return [r.choices[0].message.content for r in replies] + [streamed]

    assert asyncio.run(main()) == [f"number {i}" for i in range(6)] + ["async stream"]


def test_completions_prompts_echo_and_stream(client: Any) -> None:
    reply = client.completions.create(model="toy_llm", prompt="SAY:abc", echo=True)
    assert reply.choices[0].text == "SAY:abcabc" and reply.choices[0].finish_reason == "stop"
    several = client.completions.create(model="toy_llm", prompt=["SAY:one", "SAY:two"], n=2)
    assert [c.text for c in several.choices] == ["one", "one", "two", "two"]

    tokens = client.completions.create(model="toy_llm", prompt="SAY:tokens", max_tokens=1)
    prompt_ids = client.completions.create(model="toy_llm", prompt=[[83, 65]], max_tokens=1)
    assert tokens.usage.completion_tokens == 1 and prompt_ids.usage.prompt_tokens == 2
    stream = client.completions.create(model="toy_llm", prompt="SAY:flowing text", stream=True)
    assert "".join(c.choices[0].text for c in stream) == "flowing text"
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="toy_llm", prompt="x", suffix="after")
    assert caught.value.body["param"] == "suffix"


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def test_tool_calls_parsed_and_streamed(client: Any) -> None:
    reply = client.chat.completions.create(model="toy_llm", messages=_say(CALL), tools=TOOLS)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    # The call and the tool's answer go back to the model (role: tool) through its template.
    follow = client.chat.completions.create(
        model="toy_llm",
        tools=TOOLS,
        messages=[
            *_say(CALL),
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "SAY:It is sunny."},
        ],
    )
    assert follow.choices[0].message.content == "It is sunny."
    stream = client.chat.completions.create(
        model="toy_llm", messages=_say("Let me look. " + CALL), tools=TOOLS, stream=True
    )
    chunks = [c for c in stream if c.choices]
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    calls = [t for c in chunks for t in (c.choices[0].delta.tool_calls or [])]
    assert content == "Let me look. "
    assert [(t.index, t.function.name) for t in calls] == [(0, "get_weather")]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # tool_choice "none": the text stays text.
    plain = client.chat.completions.create(
        model="toy_llm", messages=_say(CALL), tools=TOOLS, tool_choice="none"
    )
    assert plain.choices[0].message.content == CALL and not plain.choices[0].message.tool_calls


def test_named_tool_choice(client: Any) -> None:
    reply = client.chat.completions.create(
        model="toy_llm",
        messages=_say('{"city": "Oslo"}'),
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {
        "city": "Oslo"
    }
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="toy_llm",
            messages=_say("x"),
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "not_a_tool"}},
        )


def test_restricted_api_and_error_shape(served: tuple[ServerProcess, int]) -> None:
    process, _ = served
    bare = openai.OpenAI(base_url=f"http://{process.http_url}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.PermissionDeniedError) as caught:
        bare.chat.completions.create(model="toy_llm", messages=_say("x"))
    assert "x-inference-key" in caught.value.body["message"]
    assert [m.id for m in bare.models.list().data] == ["toy_llm"]  # metadata is not restricted


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        ("chat/completions", {"model": "toy_llm", "messages": []}, "messages"),
        ("chat/completions", {"model": "toy_llm", "messages": [{"role": "robot"}]}, "messages"),
        ("chat/completions", {"model": "toy_llm", "messages": "hi"}, "messages"),
        ("chat/completions", {"messages": [{"role": "user", "content": "x"}]}, "model"),
        ("chat/completions", {"model": "toy_llm", "messages": [], "n": 17}, "n"),
        ("completions", {"model": "toy_llm", "prompt": "x", "temperature": "hot"}, "temperature"),
        ("completions", {"model": "toy_llm", "prompt": "x", "top_p": 1.5}, "top_p"),
        ("completions", {"model": "toy_llm", "prompt": "x", "max_tokens": 0}, "max_tokens"),
        ("completions", {"model": "toy_llm", "prompt": "x", "stream": 1}, "stream"),
        ("completions", {"model": "toy_llm", "prompt": [True]}, "prompt"),
        ("completions", {"model": "toy_llm", "prompt": "x", "stop": ["a"] * 17}, "stop"),
        ("embeddings", {"model": "toy_llm", "input": "x", "encoding_format": "hex"}, None),
    ],
)
def test_bodies_are_checked_by_their_schema(
    served: tuple[ServerProcess, int], route: str, body: dict[str, Any], param: str | None
) -> None:
    """A body that does not fit its schema is OpenAI's 400 naming the field, before any model
    is looked up (the client's own checks bypassed: raw HTTP)."""
    process, _ = served
    request = urllib.request.Request(
        f"http://{process.http_url}/v1/{route}",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", **HEADER},
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request)
    assert caught.value.code == 400
    error = json.loads(caught.value.read())["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == (param or "encoding_format")
    assert error["message"]


def test_a_body_that_is_not_json_is_a_400(served: tuple[ServerProcess, int]) -> None:
    process, _ = served
    for data in (b"{not json", b"[1, 2]"):
        request = urllib.request.Request(
            f"http://{process.http_url}/v1/completions", data=data, headers=HEADER
        )
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request)
        assert caught.value.code == 400
        assert json.loads(caught.value.read())["error"]["type"] == "invalid_request_error"


def _running(client: Any) -> str:
    reply = client.chat.completions.create(model="toy_llm", messages=_say("RUNNING"))
    return str(reply.choices[0].message.content)


def test_cut_stream_frees_the_model_at_once(client: Any) -> None:
    """The model stops generating because the request was cancelled (it counts that), not
    because it reached its end."""
    before = int(_running(client).split(", ")[1].split()[0])
    stream = client.chat.completions.create(model="toy_llm", messages=_say("FOREVER"), stream=True)
    for number, _ in enumerate(stream):
        if number == 5:
            break
    stream.close()
    expected = f"0 running, {before + 1} cancelled"
    deadline = time.monotonic() + 10  # the model sees the cancellation at its next token
    seen = _running(client)
    while seen != expected and time.monotonic() < deadline:
        seen = _running(client)
    assert seen == expected


def test_n_choices_stream_side_by_side(client: Any) -> None:
    stream = client.chat.completions.create(
        model="toy_llm", messages=_say("two ways"), n=2, stream=True
    )
    texts = ["", ""]
    finishes = [None, None]
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            finishes[choice.index] = choice.finish_reason or finishes[choice.index]
    assert texts == ["two ways", "two ways"] and finishes == ["stop", "stop"]


def test_chat_template_flag_replaces_the_models_own(tmp_path: Path, launch: Any) -> None:
    """--chat-template (a file here): the toy model then reads the upper-cased message."""
    write_toy_llm(tmp_path)
    template = tmp_path / "template.jinja"
    template.write_text("{% for m in messages %}{{ m.content | upper }}{% endfor %}")
    process = launch([tmp_path], [f"--chat-template={template}"])
    plain = openai.OpenAI(base_url=f"http://{process.http_url}/v1", api_key="x")
    reply = plain.chat.completions.create(
        model="toy_llm", messages=[{"role": "user", "content": "say:quiet words"}]
    )
    assert reply.choices[0].message.content == "QUIET WORDS"
