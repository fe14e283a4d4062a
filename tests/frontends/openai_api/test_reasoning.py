"""Reasoning set apart (vLLM's --reasoning-parser, oceanus/frontends/openai/reasoning.py): the
thinking between <think> and </think> comes back as `reasoning_content`, whole and streamed
(reasoning deltas first, then content), with the tags gone from `content`.

Served by a real server on loopback with the toy model (it says what follows `SAY:`, token by
token, so the tags arrive split across tokens) and the config's `reasoning_parser` parameter."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from oceanus.frontends.openai.reasoning import PARSERS, ReasoningStream

openai = pytest.importorskip("openai")
pytest.importorskip("tokenizers")

from oceanus.examples.toy_llm import write_toy_llm  # noqa: E402
from tests.conftest import ServerProcess  # noqa: E402


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("deepseek_r1", "<think>a b</think>\n\nThe answer", ("a b", "\n\nThe answer")),
        ("deepseek_r1", "a b</think>answer", ("a b", "answer")),  # <think> was in the prompt
        ("deepseek_r1", "never closed", ("never closed", None)),
        ("qwen3", "<think>x</think>y", ("x", "y")),
        ("qwen3", "no thinking here", ("", "no thinking here")),
        ("qwen3", "<think>cut short", ("cut short", None)),
    ],
)
def test_split(name: str, text: str, expected: tuple[str, str | None]) -> None:
    assert PARSERS[name].split(text) == expected


@pytest.mark.parametrize("name", ["deepseek_r1", "qwen3"])
def test_a_stream_split_anywhere_adds_up_to_the_whole(name: str) -> None:
    text = "<think>step one, step two</think>The answer is 4."
    whole = PARSERS[name].split(text)
    for cut in range(1, len(text)):
        stream = ReasoningStream(PARSERS[name])
        sent, content = "", ""
        for end in (cut, len(text)):
            delta, content = stream.feed(text[:end], final=end == len(text))
            sent += delta
            assert "<" not in delta  # no piece of a tag is ever sent as reasoning
        assert (sent, content) == (whole[0], whole[1] or "")


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    repository = tmp_path_factory.mktemp("reasoning")
    for name, parser in (("r1", "deepseek_r1"), ("qwen", "qwen3")):
        folder = write_toy_llm(repository, name)
        with open(folder / "config.pbtxt", "a") as config:
            config.write(
                f'parameters {{ key: "reasoning_parser" value {{ string_value: "{parser}" }} }}\n'
            )
    process = ServerProcess([repository])
    try:
        process.wait_live()
        yield openai.OpenAI(base_url=f"http://{process.http_url}/v1", api_key="unused")
    finally:
        process.stop()


def _say(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"SAY:{text}"}]


@pytest.mark.parametrize("model", ["r1", "qwen"])
def test_reasoning_content_whole_and_streamed(client: Any, model: str) -> None:
    said = "<think>Two and two, that is four.</think>It is 4."
    whole = client.chat.completions.create(model=model, messages=_say(said))
    message = whole.choices[0].message
    assert message.reasoning_content == "Two and two, that is four."
    assert message.reasoning == message.reasoning_content  # vLLM 0.32's name for it
    assert message.content == "It is 4."
    chunks = list(client.chat.completions.create(model=model, messages=_say(said), stream=True))
    kinds, reasoning, content = [], "", ""
    for chunk in chunks:
        delta = chunk.choices[0].delta
        thought = getattr(delta, "reasoning_content", None)
        if thought:
            reasoning += thought
            kinds.append("reasoning")
        if delta.content:
            content += delta.content
            kinds.append("content")
    assert (reasoning, content) == (message.reasoning_content, message.content)
    # vLLM's order: every reasoning delta, then the content
    assert kinds == sorted(kinds, key=lambda kind: kind == "content") and "reasoning" in kinds
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_qwen3_without_thinking_is_all_content(client: Any) -> None:
    message = client.chat.completions.create(model="qwen", messages=_say("Just 4.")).choices[0]
    assert message.message.content == "Just 4."
    assert not message.message.reasoning_content


def test_frontend_workers_read_the_parser_of_an_engine_model(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """With --frontend-workers the workers plan the engine's chats themselves, from the core's
    mirror: it carries the config's reasoning_parser. deepseek_r1 reads a reply without
    </think> as all reasoning (vLLM's reading), so the random model's reply is reasoning."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from oceanus.examples.llm import write_llm_model

    repository = tmp_path_factory.mktemp("reasoning_workers")
    folder = write_llm_model(repository, "llm")
    with open(folder / "config.pbtxt", "a") as config:
        config.write(
            'parameters { key: "reasoning_parser" value { string_value: "deepseek_r1" } }\n'
        )
    process = ServerProcess([repository], ["--frontend-workers=2"])
    try:
        process.wait_live()
        client = openai.OpenAI(base_url=f"http://{process.http_url}/v1", api_key="unused")
        asked: dict[str, Any] = {"model": "llm", "max_tokens": 6, "temperature": 0}
        asked["messages"] = [{"role": "user", "content": "Hi"}]
        message = client.chat.completions.create(**asked).choices[0].message
        assert message.reasoning_content and message.content is None
        thought = ""
        for chunk in client.chat.completions.create(**asked, stream=True):
            if chunk.choices:
                assert not chunk.choices[0].delta.content
                thought += getattr(chunk.choices[0].delta, "reasoning_content", None) or ""
        assert thought == message.reasoning_content
    finally:
        process.stop()
