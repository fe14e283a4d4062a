"""LoRA adapters through a real server: Triton's vLLM-backend way (model.json `enable_lora`,
`multi_lora.json` beside it, `lora_name` in the sampling parameters) and vLLM's (`lora_modules`,
an OpenAI request's `model` naming an adapter, /v1/models, /v1/load_lora_adapter and
/v1/unload_lora_adapter with VLLM_ALLOW_RUNTIME_LORA_UPDATING), with the official clients;
every greedy output equals transformers + peft's on the same adapter."""

from __future__ import annotations

import json
import shutil
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openai")
pytest.importorskip("peft")

import openai
from transformers import AutoTokenizer

from oceanus.examples.llm import cached_llm, write_llm_model
from tests.conftest import ServerProcess

sys.path.insert(0, str(Path(__file__).parent))
from lora_testlib import make_adapters, peft_greedy

LENGTH = 10
PROMPT = "The ocean covers"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Any]]:
    root = tmp_path_factory.mktemp("lora_server")
    adapters = make_adapters(root / "adapters")
    repository = root / "repository"
    folder = write_llm_model(
        repository,
        "llm_lora",
        engine_args={
            "enable_lora": "true",  # Triton's backend reads a string or a bool
            "max_loras": 3,
            "lora_modules": [{"name": "all", "path": str(adapters["all"])}],
        },
    )
    # multi_lora.json: a folder relative to the version folder, and an absolute one.
    shutil.copytree(adapters["attn"], folder / "1" / "attn")
    multi = {"attn": "attn", "mlp": str(adapters["mlp"])}
    (folder / "1" / "multi_lora.json").write_text(json.dumps(multi))
    write_llm_model(repository, "llm_plain")
    process = ServerProcess([repository], env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})
    try:
        process.wait_live()
        process.adapters = adapters  # type: ignore[attr-defined]
        yield process, openai.OpenAI(base_url=f"http://{process.http_url}/v1", api_key="unused")
    finally:
        process.stop()


def _post(server: ServerProcess, path: str, body: Any) -> tuple[int, str]:
    request = urllib.request.Request(
        f"http://{server.http_url}{path}", json.dumps(body).encode(), method="POST"
    )
    request.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _expected(adapter: Path | None, whole_characters: bool = False) -> str:
    """transformers + peft's greedy text for PROMPT (as the server tokenizes it: with BOS).
    `whole_characters`: without a last, partial UTF-8 character, which the OpenAI routes hold
    back (results.WholeCharacters) while the tensor form sends it."""
    tokenizer = AutoTokenizer.from_pretrained(cached_llm("tiny"))
    ids = tokenizer(PROMPT)["input_ids"]
    text = str(tokenizer.decode(peft_greedy(adapter, ids, LENGTH), skip_special_tokens=True))
    return text.rstrip("\ufffd") if whole_characters else text


def _generate(server: ServerProcess, model: str, **parameters: Any) -> tuple[int, str]:
    body = {
        "text_input": PROMPT,
        "parameters": {
            "max_tokens": LENGTH,
            "temperature": 0,
            "ignore_eos": True,
            "exclude_input_in_output": True,
            **parameters,
        },
    }
    return _post(server, f"/v2/models/{model}/generate", body)


def _complete(client: Any, model: str) -> Any:
    """The openai client's greedy completion of LENGTH tokens by `model` (an adapter's name)."""
    return client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=LENGTH,
        temperature=0,
        extra_body={"ignore_eos": True},
    )


def test_triton_lora_name_from_multi_lora_json(served: tuple[ServerProcess, Any]) -> None:
    server, _ = served
    adapters = server.adapters  # type: ignore[attr-defined]
    for name in ("attn", "mlp", "all"):
        status, data = _generate(server, "llm_lora", lora_name=name)
        assert status == 200, data
        assert json.loads(data)["text_output"] == _expected(adapters[name]), name
    status, data = _generate(server, "llm_lora")
    assert json.loads(data)["text_output"] == _expected(None)
    # Triton's vLLM backend's refusals, as 400s.
    status, data = _generate(server, "llm_lora", lora_name="nope")
    assert status == 400
    assert "LoRA nope is not supported, we currently support ['attn', 'mlp', 'all']" in data
    status, data = _generate(server, "llm_plain", lora_name="attn")
    assert status == 400 and "LoRA feature is not enabled." in data


def test_openai_model_names_an_adapter(served: tuple[ServerProcess, Any]) -> None:
    server, client = served
    adapters = server.adapters  # type: ignore[attr-defined]
    cards = {m.id: m for m in client.models.list().data}
    assert cards["mlp"].parent == "llm_lora" and cards["mlp"].root == str(adapters["mlp"])
    assert cards["all"].parent == "llm_lora" and cards["llm_lora"].parent is None
    one = client.models.retrieve("attn")
    assert one.parent == "llm_lora" and one.root.endswith("attn")
    reply = _complete(client, "mlp")
    assert reply.model == "mlp"
    assert reply.choices[0].text == _expected(adapters["mlp"], whole_characters=True)
    assert reply.usage.completion_tokens == LENGTH
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt=PROMPT, max_tokens=2)


def _metric_lines(server: ServerProcess) -> list[str]:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as reply:
        text = reply.read().decode()
    return [line for line in text.splitlines() if line.startswith("vllm:lora_requests_info{")]


def test_load_and_unload_while_streams_run(served: tuple[ServerProcess, Any]) -> None:
    """Streams on an adapter while another is loaded and unloaded again and again: none fails,
    each equals peft's output; an unloaded adapter is a 404 for new requests."""
    server, client = served
    adapters = server.adapters  # type: ignore[attr-defined]
    want = _expected(adapters["attn"], whole_characters=True)
    failures: list[BaseException] = []
    texts: list[str] = []
    started = threading.Barrier(5)

    def stream() -> None:
        try:
            started.wait(60)
            for _ in range(3):
                chunks = client.completions.create(
                    model="attn",
                    prompt=PROMPT,
                    max_tokens=LENGTH,
                    temperature=0,
                    stream=True,
                    extra_body={"ignore_eos": True},
                )
                texts.append("".join(c.choices[0].text for c in chunks))
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=stream) for _ in range(4)]
    for thread in threads:
        thread.start()
    started.wait(60)
    load = {"lora_name": "extra", "lora_path": str(adapters["all"])}
    for _ in range(4):
        assert _post(server, "/v1/load_lora_adapter", load) == (
            200,
            "Success: LoRA adapter 'extra' added successfully.",
        )
        reply = _complete(client, "extra")
        assert reply.choices[0].text == _expected(adapters["all"], whole_characters=True)
        assert _post(server, "/v1/unload_lora_adapter", {"lora_name": "extra"}) == (
            200,
            "Success: LoRA adapter 'extra' removed successfully.",
        )
    for thread in threads:
        thread.join(120)
    assert not failures, failures
    assert texts == [want] * 12
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="extra", prompt=PROMPT, max_tokens=2)
    # vLLM's refusals: its words and status codes.
    status, data = _post(server, "/v1/load_lora_adapter", {"lora_name": "attn", "lora_path": "x"})
    assert status == 400 and "The lora adapter 'attn' has already been loaded." in data
    status, data = _post(
        server, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/nowhere"}
    )
    assert status == 404 and "No adapter found for /nowhere" in data
    status, data = _post(server, "/v1/unload_lora_adapter", {"lora_name": "extra"})
    assert status == 404 and "The lora adapter 'extra' cannot be found." in data
    status, data = _post(server, "/v1/load_lora_adapter", {"lora_name": "x"})
    assert status == 400 and "Both 'lora_name' and 'lora_path' must be provided." in data


def test_lora_requests_info(served: tuple[ServerProcess, Any]) -> None:
    """vllm:lora_requests_info names the adapters running (here while a long stream runs) and
    max_lora; the model without LoRA says max_lora 0."""
    server, client = served
    chunks = client.completions.create(
        model="attn",
        prompt=PROMPT,
        max_tokens=900,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    # The gauge is set after each engine step; a step's tokens leave before its end (a
    # prefill's first token even before the step's decode pass): the third chunk comes from a
    # later step than the first, so the first step's update is done. 900 tokens run on.
    stream = iter(chunks)
    for _ in range(3):
        next(stream)
    lines = _metric_lines(server)
    for _ in stream:
        pass
    running = [line for line in lines if 'model="llm_lora"' in line]
    assert len(running) == 1
    assert 'running_lora_adapters="attn"' in running[0] and 'max_lora="3"' in running[0]
    plain = [line for line in _metric_lines(server) if 'model="llm_plain"' in line]
    assert len(plain) == 1 and 'max_lora="0"' in plain[0]
