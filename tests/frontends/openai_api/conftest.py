"""One server for the tests of the routes vLLM's clients use beside chat and completions
(tokenize, score, the Responses API, Anthropic's messages): the tiny language model, as `llm`,
with tool calls in Hermes' format, a small embedding model, as `embedder`, and small
cross-encoders with one label (`reranker`) and three (`classifier3`), and the language model
as an embedding model (`llm_embed`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import ServerProcess

CONTEXT = 256
# A tool's parameters (its city short, so that a random model's call ends soon).
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}},
    "required": ["city"],
    "additionalProperties": False,
}


@pytest.fixture(scope="session")
def llm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    from oceanus.examples.cross_encoder import write_cross_encoder_model
    from oceanus.examples.embedder import write_embedding_model
    from oceanus.examples.llm import write_llm_model

    repository = tmp_path_factory.mktemp("vllm_routes")
    folder = write_llm_model(repository, "llm", engine_args={"max_model_len": CONTEXT})
    with open(folder / "config.pbtxt", "a") as config:
        config.write('parameters { key: "tool_call_parser" value { string_value: "hermes" } }\n')
    write_embedding_model(repository, "embedder")  # /v1/score and /v1/rerank
    write_cross_encoder_model(repository, "reranker")
    # The language model again, served as an embedding model (vLLM's runner "pooling").
    write_llm_model(repository, "llm_embed", engine_args={"runner": "pooling"})
    write_cross_encoder_model(repository, "classifier3", num_labels=3)
    process = ServerProcess([repository])
    process.repository = repository  # type: ignore[attr-defined]  # the tests read its models
    try:
        process.wait_live()
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="session")
def client_of(llm_server: Any) -> Any:
    """The official client of an API (its module's name), on the server; skips without it."""

    def make(name: str) -> Any:
        module = pytest.importorskip(name)
        if name == "anthropic":  # its base_url has no /v1: the client adds it
            return module.Anthropic(base_url=f"http://{llm_server.http_url}", api_key="unused")
        return module.OpenAI(base_url=f"http://{llm_server.http_url}/v1", api_key="unused")

    return make


def call(server: Any, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
    """(status, body) of one plain HTTP request to the server."""
    import json
    import urllib.error
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://{server.http_url}{path}", data, method=method)
    request.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
