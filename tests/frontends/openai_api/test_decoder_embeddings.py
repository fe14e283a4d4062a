"""/v1/embeddings on a decoder (a generating model), as vLLM: refused unless model.json's
`"runner": "pooling"` (vLLM's --runner pooling) serves it as an embedding model, whose vector is
the last token's final hidden state, normalized (vLLM's pooling of a decoder): equal to
transformers' own within 1e-5, through the official client."""

from __future__ import annotations

from typing import Any

import pytest

openai = pytest.importorskip("openai")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TEXTS = ["The ocean covers most of the planet", "Hello world"]


def _expected(text: str) -> Any:
    from oceanus.examples.llm import cached_llm

    folder = cached_llm("tiny")
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModel.from_pretrained(folder).eval()
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        hidden = model(input_ids=ids).last_hidden_state[0, -1]
    return torch.nn.functional.normalize(hidden, dim=-1), int(ids.shape[1])


def test_a_pooling_runner_embeds_with_the_last_token(client_of: Any) -> None:
    client = client_of("openai")
    reply = client.embeddings.create(model="llm_embed", input=TEXTS)
    tokens = 0
    for item, text in zip(reply.data, TEXTS, strict=True):
        vector, count = _expected(text)
        tokens += count
        got = torch.tensor(item.embedding)
        assert abs(float(got.norm()) - 1.0) < 1e-5
        assert float((got - vector).abs().max()) < 1e-5
    assert reply.usage.prompt_tokens == tokens
    with pytest.raises(openai.BadRequestError):  # a pooling model generates nothing, as vLLM's
        client.chat.completions.create(
            model="llm_embed", messages=[{"role": "user", "content": "hi"}]
        )


def test_a_generating_model_refuses_embeddings(client_of: Any) -> None:
    client = client_of("openai")
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model="llm", input="hello")
    assert caught.value.body["param"] == "model"
    assert '"runner": "pooling"' in caught.value.body["message"]
