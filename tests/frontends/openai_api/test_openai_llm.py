"""The OpenAI API over the language-model engine (backend "vllm", issue 25): the same routes
serve Triton's vLLM model folders; usage and the default max_tokens come from the model's own
tokenizer and context length; structured output is enforced by the engine's grammar; an
embedding model in the same folder form answers /v1/embeddings."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("transformers")
pytest.importorskip("torch")

from oceanus.examples.embedder import EMBEDDING_WIDTH, write_embedding_model  # noqa: E402
from oceanus.examples.llm import write_llm_model  # noqa: E402
from tests.conftest import ServerProcess  # noqa: E402

CONTEXT = 96


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    repository = tmp_path_factory.mktemp("openai_llm")
    folder = write_llm_model(repository, "llm", engine_args={"max_model_len": CONTEXT})
    with open(folder / "config.pbtxt", "a") as config:  # tool calls in Hermes' format
        config.write('parameters { key: "tool_call_parser" value { string_value: "hermes" } }\n')
    write_embedding_model(repository, "embedder")
    process = ServerProcess([repository])
    try:
        process.wait_live()
        client = openai.OpenAI(base_url=f"http://{process.http_url}/v1", api_key="unused")
        client.repository = repository  # type: ignore[attr-defined]
        yield client
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


def test_default_max_tokens(client: Any) -> None:
    """Chat: what the context leaves (as vLLM); completions: 16 (as OpenAI and vLLM)."""
    ask: dict[str, Any] = {"model": "llm", "temperature": 0, "extra_body": {"ignore_eos": True}}
    chat = client.chat.completions.create(messages=[{"role": "user", "content": "Hi"}], **ask)
    assert chat.usage.total_tokens == CONTEXT
    reply = client.completions.create(prompt="Once upon a time", **ask)
    assert reply.usage.completion_tokens == 16
    near = client.completions.create(prompt=[65] * (CONTEXT - 8), **ask)  # less room than 16
    assert near.usage.total_tokens == CONTEXT
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="llm", prompt="la " * 200)
    assert f"maximum context length is {CONTEXT} tokens" in caught.value.body["message"]


def test_a_token_id_out_of_the_vocabulary_is_a_400(client: Any) -> None:
    """As vLLM's (the engine's embedding lookup failed the step: a 500)."""
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="llm", prompt=[1, 999999], max_tokens=1)
    assert caught.value.body["param"] == "prompt"
    assert caught.value.body["message"] == "Token id 999999 is out of vocabulary"


def test_completion_logprobs(client: Any) -> None:
    reply = client.completions.create(
        model="llm", prompt="The weather", max_tokens=4, logprobs=2, temperature=0
    )
    logprobs = reply.choices[0].logprobs
    assert len(logprobs.token_logprobs) == 4
    assert all(len(top) >= 1 for top in logprobs.top_logprobs)
    many = client.completions.create(  # up to 20, as vLLM (OpenAI: 5)
        model="llm", prompt="The weather", max_tokens=2, logprobs=20, temperature=0
    )
    # (keyed by text, as OpenAI's: tokens that decode alike share an entry)
    assert max(len(top) for top in many.choices[0].logprobs.top_logprobs) > 5


def test_a_reply_cut_inside_a_character_drops_its_bytes(client: Any) -> None:
    """Byte-level tokens: a reply cut by max_tokens may end inside a UTF-8 character. Its
    bytes are dropped (as vLLM), never sent as U+FFFD, whole or streamed."""
    for seed in range(12):
        ask = {"model": "llm", "prompt": "\u00e9t\u00e9 \u4e2d\u6587", "max_tokens": 3}
        ask |= {"seed": seed, "extra_body": {"ignore_eos": True}}
        whole = client.completions.create(**ask)
        streamed = "".join(c.choices[0].text for c in client.completions.create(**ask, stream=True))
        assert not whole.choices[0].text.endswith("\ufffd")
        assert streamed == whole.choices[0].text


def test_messages_without_content(client: Any) -> None:
    """The openai SDK sends back an assistant's tool calls with `content: null`; a user
    message without content is OpenAI's missing-parameter error, not a template failure."""
    call = {"id": "call_1", "type": "function"}
    call["function"] = {"name": "weather", "arguments": '{"city": "Paris"}'}
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    reply = client.chat.completions.create(model="llm", messages=messages, max_tokens=2)
    assert reply.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="llm", messages=[{"role": "user"}], max_tokens=2)
    assert caught.value.body["param"] == "messages.[0].content"
    assert caught.value.body["code"] == "missing_required_parameter"


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


def test_required_tool_choice_always_calls(client: Any) -> None:
    """Random weights again: only the grammar makes every reply a call of a given function."""
    jsonschema = pytest.importorskip("jsonschema")
    pytest.importorskip("llguidance")
    import json

    schemas = {
        name: {
            "type": "object",
            "properties": {"c": {"type": "string", "maxLength": 3}},
            "required": ["c"],
            "additionalProperties": False,
        }
        for name in ("w", "t")
    }
    tools = [
        {"type": "function", "function": {"name": n, "parameters": p}} for n, p in schemas.items()
    ]
    for seed in range(3):
        reply = client.chat.completions.create(
            model="llm",
            messages=[{"role": "user", "content": "Weather?"}],
            tools=tools,
            tool_choice="required",
            seed=seed,
        )
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", choice.message
        assert choice.message.content is None
        (call,) = choice.message.tool_calls
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])


def _reference(folder: Any, texts: list[str]) -> Any:
    """Mean pooling and normalizing as sentence-transformers defines them, with transformers."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModel.from_pretrained(str(folder)).eval()
    rows = []
    for text in texts:
        ids = torch.tensor([tokenizer(text)["input_ids"]])
        with torch.inference_mode():
            hidden = model(input_ids=ids).last_hidden_state[0]
        rows.append(torch.nn.functional.normalize(hidden.mean(dim=0), dim=0).numpy())
    return rows


def test_embeddings_float_base64_and_dimensions(client: Any) -> None:
    import base64

    import numpy as np

    texts = ["hello world", "The weather is sunny"]
    floats = client.embeddings.create(model="embedder", input=texts, encoding_format="float")
    assert [d.index for d in floats.data] == [0, 1]
    assert floats.usage.prompt_tokens > 0
    expected = _reference(client.repository / "embedder" / "hf", texts)
    for item, reference in zip(floats.data, expected, strict=True):
        vector = np.array(item.embedding)
        assert vector.shape == (EMBEDDING_WIDTH,)
        np.testing.assert_allclose(vector, reference, atol=1e-5)
    raw = client.with_raw_response.embeddings.create(
        model="embedder", input="hello world", encoding_format="base64"
    )
    encoded = raw.http_response.json()["data"][0]["embedding"]
    decoded = np.frombuffer(base64.b64decode(encoded), dtype="<f4")
    np.testing.assert_allclose(decoded, floats.data[0].embedding, atol=1e-6)
    short = client.embeddings.create(model="embedder", input="hello world", dimensions=16)
    vector = np.array(short.data[0].embedding)
    assert vector.shape == (16,) and abs(float(np.linalg.norm(vector)) - 1) < 1e-5
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model="embedder", input="x", dimensions=EMBEDDING_WIDTH + 1)
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model="llm", input="x")  # a generating model does not embed
    assert "is a generative model" in caught.value.body["message"]


def test_logit_bias_forces_and_bans_tokens(client: Any) -> None:
    from tokenizers import Tokenizer

    from oceanus.examples.llm import cached_llm

    tokenizer = Tokenizer.from_file(str(cached_llm("tiny") / "tokenizer.json"))
    ask = {"model": "llm", "prompt": "The weather", "max_tokens": 4, "temperature": 0}
    ask["extra_body"] = {"ignore_eos": True}
    plain = client.completions.create(**ask, logprobs=0)
    forced = tokenizer.token_to_id("Ġthe")  # " the"
    assert forced is not None
    reply = client.completions.create(**ask, logit_bias={str(forced): 100})
    assert reply.choices[0].text == tokenizer.decode([forced] * 4)
    # -100 on the tokens of the plain reply: the greedy choice must be another token
    banned = {str(t): -100 for t in tokenizer.encode(plain.choices[0].text).ids}
    other = client.completions.create(**ask, logprobs=0, logit_bias=banned)
    assert other.choices[0].logprobs.tokens[0] != plain.choices[0].logprobs.tokens[0]
    chat = client.chat.completions.create(
        model="llm",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=3,
        temperature=0,
        logit_bias={str(forced): 100},
        extra_body={"ignore_eos": True},
    )
    assert chat.choices[0].message.content == tokenizer.decode([forced] * 3)
    for bias, words in (
        ({str(tokenizer.get_vocab_size()): 1}, "out of the vocabulary"),
        ({str(forced): 101}, "in [-100, 100]"),
    ):
        with pytest.raises(openai.BadRequestError) as caught:
            client.completions.create(**ask, logit_bias=bias)
        assert words in caught.value.body["message"]
        assert caught.value.body["param"] == "logit_bias"


def test_best_of_keeps_the_likeliest(client: Any) -> None:
    """best_of 3 generates the three choices n=3 would (seed, seed+1, seed+2) and shows the
    one whose tokens' logprobs sum highest, as vLLM; every generated token counts in usage."""
    ask = {"model": "llm", "prompt": "The weather", "max_tokens": 5, "seed": 5}
    ask["extra_body"] = {"ignore_eos": True}
    three = client.completions.create(**ask, n=3, logprobs=0)
    likeliest = max(three.choices, key=lambda c: sum(c.logprobs.token_logprobs))
    best = client.completions.create(**ask, best_of=3)
    (choice,) = best.choices
    assert choice.text == likeliest.text and choice.index == 0 and choice.logprobs is None
    assert best.usage.completion_tokens == three.usage.completion_tokens == 15
    for wrong in ({"best_of": 1, "n": 2}, {"best_of": 3, "stream": True}):
        with pytest.raises(openai.BadRequestError) as caught:
            client.completions.create(**ask, **wrong)
        assert caught.value.body["param"] == "best_of"
