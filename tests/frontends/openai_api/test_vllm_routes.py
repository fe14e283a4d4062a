"""vLLM's routes beside the OpenAI ones: /tokenize, /detokenize, /health, /version, the
model list's max_model_len, /v1/score and /v1/rerank on an embedding model."""

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
    status, unnamed = _json(llm_server, "POST", "/tokenize", chat_body)
    assert status == 400 and "name the 'model'" in unnamed["error"]["message"]  # two served
    _, chat = _json(llm_server, "POST", "/tokenize", {**chat_body, "model": "llm"})
    assert chat["count"] > 2 and len(chat["token_strs"]) == chat["count"]
    _, back = _json(llm_server, "POST", "/detokenize", {"model": "llm", "tokens": found["tokens"]})
    assert back == {"prompt": reference.decode(found["tokens"], skip_special_tokens=False)}
    status, bad = _json(llm_server, "POST", "/tokenize", {"model": "llm"})
    assert status == 400 and bad["error"]["param"] == "prompt"
    assert call(llm_server, "GET", "/health") == (200, b"")
    assert isinstance(_json(llm_server, "GET", "/version")[1]["version"], str)


def test_models_list_their_context(llm_server: Any) -> None:
    models = {m["id"]: m for m in _json(llm_server, "GET", "/v1/models")[1]["data"]}
    model = models["llm"]
    assert model["max_model_len"] == CONTEXT
    assert model["root"] == "llm" and model["parent"] is None
    assert model["permission"][0]["object"] == "model_permission"


def test_runtime_lora_routes_need_vllms_switch(llm_server: Any) -> None:
    """Without VLLM_ALLOW_RUNTIME_LORA_UPDATING the routes do not exist, as in vLLM."""
    body = {"lora_name": "a", "lora_path": "/nowhere"}
    assert call(llm_server, "POST", "/v1/load_lora_adapter", body)[0] == 404
    assert call(llm_server, "POST", "/v1/unload_lora_adapter", {"lora_name": "a"})[0] == 404


def test_score_and_rerank_by_cosine(llm_server: Any) -> None:
    import numpy as np

    texts = ["The weather is sunny", "It is bright and warm", "Stock prices fell"]
    _, embedded = _json(llm_server, "POST", "/v1/embeddings", {"model": "embedder", "input": texts})
    vectors = [np.array(item["embedding"]) for item in embedded["data"]]
    cosines = [
        float(vectors[0] @ v / np.linalg.norm(vectors[0]) / np.linalg.norm(v)) for v in vectors
    ]
    body = {"model": "embedder", "text_1": texts[0], "text_2": texts[1:]}
    status, scored = _json(llm_server, "POST", "/v1/score", body)
    assert status == 200, scored
    assert [d["index"] for d in scored["data"]] == [0, 1] and scored["object"] == "list"
    np.testing.assert_allclose([d["score"] for d in scored["data"]], cosines[1:], atol=1e-5)
    body = {"model": "embedder", "query": texts[0], "documents": texts[1:], "top_n": 1}
    _, ranked = _json(llm_server, "POST", "/rerank", body)  # vLLM serves it without /v1 too
    (best,) = ranked["results"]
    assert best["index"] == int(np.argmax(cosines[1:])) and best["document"]["text"] in texts
    status, refused = _json(llm_server, "POST", "/v1/score", {**body, "model": "llm"})
    assert status == 400
    status, refused = _json(
        llm_server, "POST", "/v1/score", {"model": "llm", "text_1": "a", "text_2": "b"}
    )
    assert status == 400 and "generative model" in refused["error"]["message"]
