"""One tokenizer, one count (issue 38): a tokenizer whose post-processor adds BOS and a chat
template that writes `{{ bos_token }}` itself. The rendered chat is tokenized once, without added
special tokens (as vLLM's chat path), and the engine takes those ids as they are: the OpenAI
usage and the engine's vllm:prompt_tokens_total count the same tokens, one BOS. A completion's
prompt gets the tokenizer's BOS, as vLLM's completions do, and is counted the same on both sides.
With frontend workers the same holds, and the template is rendered and tokenized in the workers:
the core's log shows no chat or completion forwarded whole."""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("transformers")
pytest.importorskip("torch")
tokenizers = pytest.importorskip("tokenizers")

from oceanus.examples.llm import CHAT_TEMPLATE, cached_llm, write_llm_model  # noqa: E402
from tests.conftest import ServerProcess  # noqa: E402

MESSAGES = [{"role": "user", "content": "Hello there, how is the ocean today?"}]


def _bos_model(folder: Path) -> Path:
    """The tests' tiny model with a tokenizer that adds BOS to every encoding it is asked to."""
    shutil.copytree(cached_llm("tiny"), folder)
    tokenizer = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    bos = tokenizer.token_to_id("<|begin|>")
    tokenizer.post_processor = tokenizers.processors.TemplateProcessing(
        single="<|begin|> $A", pair="<|begin|> $A $B", special_tokens=[("<|begin|>", bos)]
    )
    tokenizer.save(str(folder / "tokenizer.json"))
    assert CHAT_TEMPLATE.startswith("{{ bos_token }}")
    return folder


@pytest.fixture(scope="module", params=[0, 2], ids=["in-process", "frontend-workers"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Any, Any, Any]]:
    root = tmp_path_factory.mktemp("one_tokenizer")
    model = _bos_model(root / "hf")
    repository = root / "repo"
    write_llm_model(repository, "llm", engine_args={"model": str(model), "max_model_len": 256})
    write_llm_model(repository, "llm_long", engine_args={"model": str(model)})  # 1024 tokens
    process = ServerProcess(
        [repository], [f"--frontend-workers={request.param}", "--log-verbose=1"]
    )
    try:
        process.wait_live()
        client = openai.OpenAI(base_url=f"http://{process.http_url}/v1", api_key="unused")
        reference = tokenizers.Tokenizer.from_file(str(model / "tokenizer.json"))
        yield client, process, reference
        if request.param:
            # Planned in the workers: the core forwarded none of them whole (it logs each call
            # a worker forwards), while /v1/models still goes to the core.
            client.models.list()
            log = process.log()
            assert "forwarded HTTP GET /v1/models" in log
            assert "forwarded HTTP POST /v1/chat" not in log
            assert "forwarded HTTP POST /v1/completions" not in log
    finally:
        process.stop()


def _metric(process: Any, name: str, model: str = "llm") -> float:
    url = f"http://127.0.0.1:{process.metrics_port}/metrics"
    with urllib.request.urlopen(url) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith(name + "{") and f'model="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} for {model} is not in /metrics")


def _prompt_tokens_total(process: Any) -> float:
    return _metric(process, "vllm:prompt_tokens_total")


def _rendered(reference: Any) -> str:
    from jinja2 import Template

    return Template(CHAT_TEMPLATE).render(
        messages=MESSAGES, add_generation_prompt=True, bos_token="<|begin|>"
    )


def test_chat_counts_the_rendered_template_once(served: tuple[Any, Any, Any]) -> None:
    client, process, reference = served
    rendered = _rendered(reference)
    once = reference.encode(rendered, add_special_tokens=False).ids
    assert reference.encode(rendered).ids[:2] == [once[0], once[0]]  # the trap: a second BOS
    before = _prompt_tokens_total(process)
    reply = client.chat.completions.create(
        model="llm", messages=MESSAGES, max_tokens=3, temperature=0
    )
    assert reply.usage.prompt_tokens == len(once)
    assert _prompt_tokens_total(process) - before == len(once)
    # Streaming takes the same path and counts the same.
    stream = client.chat.completions.create(
        model="llm",
        messages=MESSAGES,
        max_tokens=3,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage.prompt_tokens == len(once)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reply.choices[0].message.content


def test_completion_prompt_gets_the_tokenizers_bos(served: tuple[Any, Any, Any]) -> None:
    client, process, reference = served
    prompt = "The ocean covers most of the planet"
    ids = reference.encode(prompt).ids  # with the post-processor's BOS, as vLLM's completions
    before = _prompt_tokens_total(process)
    reply = client.completions.create(model="llm", prompt=prompt, max_tokens=2, temperature=0)
    assert reply.usage.prompt_tokens == len(ids)
    assert _prompt_tokens_total(process) - before == len(ids)
    # Token ids go to the engine as they are: the same count, no BOS added to them.
    reply = client.completions.create(model="llm", prompt=ids[1:], max_tokens=2, temperature=0)
    assert reply.usage.prompt_tokens == len(ids) - 1


def test_max_tokens_is_capped_by_the_engines_context(served: tuple[Any, Any, Any]) -> None:
    """One context length: model.json's max_model_len, as the engine read it."""
    client, _, reference = served
    prompt = "la " * 60
    count = len(reference.encode(prompt).ids)
    reply = client.completions.create(
        model="llm",
        prompt=prompt,
        max_tokens=256 - count,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert reply.usage.prompt_tokens == count
    assert reply.usage.total_tokens == 256
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="llm", prompt=prompt, max_tokens=256 - count + 1)
    assert "maximum context length is 256 tokens" in json.dumps(caught.value.body)


def test_a_cut_stream_frees_the_engine(served: tuple[Any, Any, Any]) -> None:
    """The client leaves after two events: the request is cancelled (through the worker's link
    when there are workers) and the engine drops it at its next step, far short of its 1000
    tokens."""
    client, process, _ = served
    before = _metric(process, "vllm:generation_tokens_total", "llm_long")
    stream = client.completions.create(
        model="llm_long",
        prompt="x",
        max_tokens=1000,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    for number, _ in enumerate(stream):
        if number == 1:
            break
    stream.close()
    # The cancellation's effect, awaited as a condition: the engine has no request running.
    deadline = time.monotonic() + 60
    while _metric(process, "vllm:num_requests_running", "llm_long") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _metric(process, "vllm:num_requests_running", "llm_long") == 0
    assert _metric(process, "vllm:generation_tokens_total", "llm_long") - before < 700


def test_sampled_logprobs_name_the_chosen_tokens(served: tuple[Any, Any, Any]) -> None:
    """Typed logprobs put the sampled token first (not the likeliest one): the tokens they name
    spell the text that was sampled."""
    client, _, _ = served
    reply = client.completions.create(
        model="llm",
        prompt="The ocean",
        max_tokens=8,
        temperature=1.0,
        seed=7,
        logprobs=2,
        extra_body={"ignore_eos": True},
    )
    choice = reply.choices[0]
    # (every sampled token is named; the text drops a character cut off at the end)
    assert "".join(choice.logprobs.tokens).rstrip("\ufffd") == choice.text
    assert len(choice.logprobs.tokens) == 8
    assert all(logprob <= 0 for logprob in choice.logprobs.token_logprobs)
