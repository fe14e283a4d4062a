"""Completions' echo with logprobs returns the prompt tokens' log probabilities, as OpenAI's and
vLLM's (the first token's null), and vLLM's `prompt_logprobs` extra field, on the real server
through the official client; the values equal transformers' log-softmax within 1e-4."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.frontends.openai_api.conftest import call

openai = pytest.importorskip("openai")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPT = "The ocean covers most of the planet"


def _reference(ids: list[int]) -> Any:
    from oceanus.examples.llm import cached_llm

    model = transformers.AutoModelForCausalLM.from_pretrained(cached_llm("tiny")).eval()
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)


def _ids(server: Any, text: str) -> list[int]:
    status, body = call(server, "POST", "/tokenize", {"model": "llm", "prompt": text})
    assert status == 200
    return list(json.loads(body)["tokens"])


def test_echo_with_logprobs_scores_the_prompt(llm_server: Any, client_of: Any) -> None:
    client = client_of("openai")
    ask = {"model": "llm", "prompt": PROMPT, "max_tokens": 3, "temperature": 0, "logprobs": 2}
    reply = client.completions.create(**ask, echo=True)
    choice = reply.choices[0]
    logprobs = choice.logprobs
    ids = _ids(llm_server, PROMPT)
    generated = reply.usage.completion_tokens
    assert len(logprobs.tokens) == len(ids) + generated
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    expected = _reference(ids)
    for position in range(1, len(ids)):
        got = logprobs.token_logprobs[position]
        assert abs(got - float(expected[position - 1, ids[position]])) < 1e-4
        top = logprobs.top_logprobs[position]
        assert logprobs.tokens[position] in top and 2 <= len(top) <= 3  # vLLM's: chosen + top 2
    # Offsets run on by each token's text, and the generated tokens follow the prompt's.
    offsets = logprobs.text_offset
    assert offsets[0] == 0
    assert all(offsets[i + 1] == offsets[i] + len(logprobs.tokens[i]) for i in range(len(ids)))
    # The generated part is what the same request without echo gets.
    plain = client.completions.create(**ask).choices[0]
    assert choice.text == PROMPT + plain.text
    assert logprobs.token_logprobs[len(ids) :] == plain.logprobs.token_logprobs
    assert getattr(plain, "prompt_logprobs", None) is None
    # vLLM's field comes with echo's logprobs too (it computed them)
    assert len(choice.model_extra["prompt_logprobs"]) == len(ids)


def test_echo_with_logprobs_streamed(client_of: Any) -> None:
    client = client_of("openai")
    ask = {"model": "llm", "prompt": PROMPT, "max_tokens": 3, "temperature": 0, "logprobs": 1}
    whole = client.completions.create(**ask, echo=True).choices[0].logprobs
    chunks = list(client.completions.create(**ask, echo=True, stream=True))
    assert chunks[0].choices[0].text.startswith(PROMPT)  # the prompt with the first text
    streamed: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "text_offset": []}
    for chunk in chunks:
        if chunk.choices[0].logprobs is not None:
            for key, values in streamed.items():
                values += getattr(chunk.choices[0].logprobs, key)
    assert streamed["tokens"] == whole.tokens
    assert streamed["token_logprobs"] == whole.token_logprobs
    assert streamed["text_offset"] == whole.text_offset


def test_vllm_prompt_logprobs_field(llm_server: Any, client_of: Any) -> None:
    client = client_of("openai")
    reply = client.completions.create(
        model="llm", prompt=PROMPT, max_tokens=2, extra_body={"prompt_logprobs": 1}
    )
    shown = reply.choices[0].model_extra["prompt_logprobs"]
    ids = _ids(llm_server, PROMPT)
    expected = _reference(ids)
    assert shown[0] is None and len(shown) == len(ids)
    for position, step in enumerate(shown[1:], start=1):
        token = ids[position]
        first = next(iter(step))
        assert first == str(token) and 1 <= len(step) <= 2
        entry = step[first]
        assert abs(entry["logprob"] - float(expected[position - 1, token])) < 1e-4
        assert (
            entry["rank"] == int((expected[position - 1] > expected[position - 1, token]).sum()) + 1
        )
    chat = client.chat.completions.create(
        model="llm",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=1,
        extra_body={"prompt_logprobs": 0},
    )
    steps = chat.model_extra["prompt_logprobs"]
    assert steps[0] is None and all(len(step) == 1 for step in steps[1:])
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(
            model="llm", prompt=PROMPT, stream=True, extra_body={"prompt_logprobs": 1}
        )
    assert caught.value.body["param"] == "prompt_logprobs"
