"""vLLM's scoring routes on an embedding model: `POST /v1/score` (`text_1` against `text_2`)
and `POST /v1/rerank` (a `query` against `documents`, Jina's and Cohere's shape, as vLLM's),
scored by the cosine of the two texts' embeddings, as vLLM scores with an embedding model.

Cross-encoders (`*ForSequenceClassification` folders, which score a pair in one pass) are not
served: the engine loads no classification head."""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
from pydantic import Field

from oceanus.frontends.openai.errors import bad_request
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


async def score(frontend: OpenAIFrontend, data: bytes) -> dict[str, Any]:
    body = parse(ScoreRequest, data)
    left = [body.text_1] if isinstance(body.text_1, str) else list(body.text_1)
    right = [body.text_2] if isinstance(body.text_2, str) else list(body.text_2)
    if len(left) == 1:
        left = left * len(right)
    if len(left) != len(right):
        raise bad_request("'text_1' must be one text or as many as 'text_2'", "text_1")
    scores, tokens = await _cosines(frontend, body.model, left, right)
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
    scores, tokens = await _cosines(frontend, body.model, [body.query] * len(documents), documents)
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
        "usage": {"total_tokens": tokens},
        "results": results,
    }
