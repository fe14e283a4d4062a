"""vLLM's /score and /rerank on a cross-encoder (a `BertForSequenceClassification` folder made by
oceanus/examples/cross_encoder.py) on the real server: each pair is scored by the classifier
head, sigmoid of its one logit (vLLM's activation for one label), equal to transformers' own
pair scoring within 1e-5; vLLM's shapes, usage and route aliases; a three-label model refuses."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.frontends.openai_api.conftest import call

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

QUERY = "What is the weather like in Paris?"
DOCUMENTS = ["It is sunny and warm in Paris", "Stock prices fell", "The weather is cold"]


def _json(server: Any, path: str, body: Any) -> tuple[int, Any]:
    status, data = call(server, "POST", path, body)
    return status, json.loads(data)


def _expected(server: Any, query: str, documents: list[str]) -> tuple[list[float], int]:
    """transformers' scores of the pairs (the folder the server loaded), and their tokens."""
    folder = server.repository / "reranker" / "hf"
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    scores, tokens = [], 0
    for document in documents:  # one pair at a time: the server's batch must change nothing
        encoded = tokenizer(query, document, return_tensors="pt")
        with torch.no_grad():
            scores.append(float(torch.sigmoid(model(**encoded).logits[0, 0])))
        tokens += int(encoded["input_ids"].shape[1])
    return scores, tokens


def test_score_pairs_with_the_classifier(llm_server: Any) -> None:
    expected, tokens = _expected(llm_server, QUERY, DOCUMENTS)
    body = {"model": "reranker", "text_1": QUERY, "text_2": DOCUMENTS}
    status, scored = _json(llm_server, "/v1/score", body)
    assert status == 200, scored
    assert scored["object"] == "list" and scored["model"] == "reranker"
    assert [d["index"] for d in scored["data"]] == [0, 1, 2]
    assert all(d["object"] == "score" for d in scored["data"])
    for got, want in zip([d["score"] for d in scored["data"]], expected, strict=True):
        assert abs(got - want) < 1e-5 and 0.0 < got < 1.0
    assert scored["usage"]["prompt_tokens"] == tokens == scored["usage"]["total_tokens"]
    # Two lists pairwise.
    pairwise = {"model": "reranker", "text_1": [QUERY, QUERY], "text_2": DOCUMENTS[:2]}
    status, both = _json(llm_server, "/score", pairwise)
    assert status == 200
    assert [round(d["score"], 5) for d in both["data"]] == [round(s, 5) for s in expected[:2]]


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v2/rerank"])
def test_rerank_best_first(llm_server: Any, path: str) -> None:
    expected, tokens = _expected(llm_server, QUERY, DOCUMENTS)
    body = {"model": "reranker", "query": QUERY, "documents": DOCUMENTS, "top_n": 2}
    status, ranked = _json(llm_server, path, body)
    assert status == 200, ranked
    order = sorted(range(len(DOCUMENTS)), key=lambda i: -expected[i])[:2]
    assert [r["index"] for r in ranked["results"]] == order
    for result in ranked["results"]:
        assert result["document"] == {"text": DOCUMENTS[result["index"]]}
        assert abs(result["relevance_score"] - expected[result["index"]]) < 1e-5
    assert ranked["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    assert ranked["id"] and ranked["model"] == "reranker"


def test_listed_with_its_context(llm_server: Any) -> None:
    """As vLLM lists it: the folder's max_position_embeddings."""
    from oceanus.examples.cross_encoder import MAX_LENGTH

    status, listed = call(llm_server, "GET", "/v1/models/reranker")
    assert status == 200 and json.loads(listed)["max_model_len"] == MAX_LENGTH


def test_a_classifier_with_several_labels_cannot_score(llm_server: Any) -> None:
    body = {"model": "classifier3", "query": QUERY, "documents": DOCUMENTS}
    status, refused = _json(llm_server, "/v1/rerank", body)
    assert status == 400 and "3 labels" in refused["error"]["message"]
    status, missing = _json(llm_server, "/v1/rerank", {**body, "model": "nothing"})
    assert status == 404 and missing["error"]["code"] == "model_not_found"
