"""The OpenAI API over the language-model engine (backend "vllm", issue 25): the same routes
serve Triton's vLLM model folders; usage and the default max_tokens come from the model's own
tokenizer and context length."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("transformers")
pytest.importorskip("torch")

from oceanus.examples.llm import write_llm_model  # noqa: E402
from tests.conftest import ServerProcess  # noqa: E402

CONTEXT = 96


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    repository = tmp_path_factory.mktemp("openai_llm")
    write_llm_model(repository, "llm", engine_args={"max_model_len": CONTEXT})
    process = ServerProcess([repository])
    try:
        process.wait_live()
        yield openai.OpenAI(base_url=f"http://{process.http_url}/v1", api_key="unused")
    finally:
        process.stop()


def test_chat_stream_equals_whole_reply_and_counts_tokens(client: Any) -> None:
    messages = [{"role": "user", "content": "Hello there"}]
    whole = client.chat.completions.create(
        model="llm", messages=messages, max_tokens=12, temperature=0
    )
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 12
    stream = client.chat.completions.create(
        model="llm",
        messages=messages,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.model_dump() == whole.usage.model_dump()


def test_default_max_tokens_fills_the_context(client: Any) -> None:
    reply = client.completions.create(
        model="llm", prompt="Once upon a time", temperature=0, extra_body={"ignore_eos": True}
    )
    assert reply.usage.total_tokens == CONTEXT
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="llm", prompt="la " * 200)
    assert f"maximum context length is {CONTEXT} tokens" in caught.value.body["message"]


def test_completion_logprobs(client: Any) -> None:
    reply = client.completions.create(
        model="llm", prompt="The weather", max_tokens=4, logprobs=2, temperature=0
    )
    logprobs = reply.choices[0].logprobs
    assert len(logprobs.token_logprobs) == 4
    assert all(len(top) >= 1 for top in logprobs.top_logprobs)


SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "size": {"enum": ["small", "large"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["ok", "size", "count"],
    "additionalProperties": False,
}


def test_json_schema_output_parses_and_validates(client: Any) -> None:
    """The model has random weights: only the grammar makes its reply valid JSON."""
    jsonschema = pytest.importorskip("jsonschema")
    pytest.importorskip("llguidance")
    import json

    for seed in range(3):
        reply = client.chat.completions.create(
            model="llm",
            messages=[{"role": "user", "content": "Describe it"}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True},
            },
            max_tokens=60,
            seed=seed,
        )
        assert reply.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(reply.choices[0].message.content), SCHEMA)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="llm",
            messages=[{"role": "user", "content": "x"}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "bad", "schema": {"type": "no-such-type"}},
            },
        )
    assert caught.value.body["param"] == "response_format"
