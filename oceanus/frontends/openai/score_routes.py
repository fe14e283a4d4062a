"""vLLM's scoring routes: `POST /v1/score` (`text_1` against `text_2`) and `POST /v1/rerank`
(a `query` against `documents`, Jina's and Cohere's shape, as vLLM's; also `/rerank`,
`/v2/rerank`). On a cross-encoder (a model with the `score_request` input: a
`*ForSequenceClassification` folder, backends/llm/classifier.py) every pair is scored in one
batched pass by its head, as vLLM does; on an embedding model by the cosine of the two texts'
embeddings, as vLLM scores with an embedding model."""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
import orjson
from pydantic import Field

from oceanus.frontends.openai import sampling
from oceanus.frontends.openai.errors import OpenAIError, bad_request
from oceanus.frontends.openai.protocol import Schema, parse

if TYPE_CHECKING:
    from oceanus.frontends.openai.app import OpenAIFrontend

Texts = str | Annotated[list[str], Field(min_length=1)]


class ScoreRequest(Schema):
    model: Annotated[str, Field(min_length=1)]
    text_1: Texts
    text_2: Texts


class RerankRequest(Schema):
    model: Annotated[str, Field(min_length=1)]
    query: str
    documents: Annotated[list[str], Field(min_length=1)]
    top_n: Annotated[int, Field(ge=0)] | None = None  # 0 or absent: all, as vLLM


async def _cosines(
    frontend: OpenAIFrontend, model: str, left: list[str], right: list[str]
) -> tuple[list[float], int]:
    """The cosine of each pair (left[i], right[i]); one embedding per distinct text."""
    texts = list(dict.fromkeys(left + right))
    vectors, tokens = await frontend.embed(model, texts)
    unit = {}
    for text, vector in zip(texts, vectors, strict=True):
        norm = float(np.linalg.norm(vector))
        unit[text] = vector / norm if norm else vector
    return [float(np.dot(unit[a], unit[b])) for a, b in zip(left, right, strict=True)], tokens


async def _scores(
    frontend: OpenAIFrontend, model: str, left: list[str], right: list[str]
) -> tuple[list[float], int]:
    """Each pair's score, and the input tokens it took."""
    if "score_request" not in frontend.model_inputs(model):
        return await _cosines(frontend, model, left, right)
    from oceanus.frontends.openai.app import _one_response

    pairs = [[a, b] for a, b in zip(left, right, strict=True)]
    request = sampling.score_request(model, "", pairs, f"score-{uuid.uuid4().hex}")
    response = await _one_response(frontend.core.infer_stream(request))
    scores, tokens = None, 0
    for tensor in response.outputs:
        value = tensor.data.reshape(-1)[0]
        if tensor.name == "text_output":
            scores = [float(s) for s in orjson.loads(value)]
        elif tensor.name == "num_input_tokens":
            tokens = int(value)
    if scores is None or len(scores) != len(pairs):
        raise OpenAIError(500, "the model's response has no score for every pair")
    return scores, tokens


async def score(frontend: OpenAIFrontend, data: bytes) -> dict[str, Any]:
    body = parse(ScoreRequest, data)
    left = [body.text_1] if isinstance(body.text_1, str) else list(body.text_1)
    right = [body.text_2] if isinstance(body.text_2, str) else list(body.text_2)
    if len(left) == 1:
        left = left * len(right)
    if len(left) != len(right):
        raise bad_request("'text_1' must be one text or as many as 'text_2'", "text_1")
    scores, tokens = await _scores(frontend, body.model, left, right)
    return {
        "id": f"score-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": body.model,
        "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
    }


async def rerank(frontend: OpenAIFrontend, data: bytes) -> dict[str, Any]:
    body = parse(RerankRequest, data)
    documents = body.documents
    scores, tokens = await _scores(frontend, body.model, [body.query] * len(documents), documents)
    order = sorted(range(len(documents)), key=lambda i: -scores[i])
    if body.top_n:
        order = order[: body.top_n]
    results = [
        {"index": i, "document": {"text": documents[i]}, "relevance_score": scores[i]}
        for i in order
    ]
    return {
        "id": f"rerank-{uuid.uuid4().hex}",
        "model": body.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},  # vLLM's RerankUsage
        "results": results,
    }
