"""vLLM's routes beside the OpenAI ones: /tokenize, /detokenize, /health, /version, and the
model list's max_model_len."""

from __future__ import annotations

import json
from typing import Any

from tests.frontends.openai_api.conftest import CONTEXT, call


def _json(server: Any, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    status, data = call(server, method, path, body)
    return status, json.loads(data)


def test_tokenize_detokenize_health_version(llm_server: Any) -> None:
    from tokenizers import Tokenizer

    from oceanus.examples.llm import cached_llm

    reference = Tokenizer.from_file(str(cached_llm("tiny") / "tokenizer.json"))
    status, found = _json(
        llm_server, "POST", "/tokenize", {"model": "llm", "prompt": "Hello world"}
    )
    assert status == 200, found
    assert found["tokens"] == reference.encode("Hello world").ids
    assert found["count"] == len(found["tokens"]) and found["max_model_len"] == CONTEXT
    assert found["token_strs"] is None
    chat_body = {"messages": [{"role": "user", "content": "Hi"}], "return_token_strs": True}
    _, chat = _json(llm_server, "POST", "/tokenize", chat_body)  # one model: no name needed
    assert chat["count"] > 2 and len(chat["token_strs"]) == chat["count"]
    _, back = _json(llm_server, "POST", "/detokenize", {"model": "llm", "tokens": found["tokens"]})
    assert back == {"prompt": reference.decode(found["tokens"], skip_special_tokens=False)}
    status, bad = _json(llm_server, "POST", "/tokenize", {"model": "llm"})
    assert status == 400 and bad["error"]["param"] == "prompt"
    assert call(llm_server, "GET", "/health") == (200, b"")
    assert isinstance(_json(llm_server, "GET", "/version")[1]["version"], str)


def test_models_list_their_context(llm_server: Any) -> None:
    (model,) = _json(llm_server, "GET", "/v1/models")[1]["data"]
    assert model["id"] == "llm" and model["max_model_len"] == CONTEXT
    assert model["root"] == "llm" and model["parent"] is None
