"""The OpenAI routes in a frontend worker: chats and completions planned where they arrive.

For a model whose engine takes typed requests (the mirror's `Generating`: the built-in LLM
engine), the worker runs the OpenAI frontend itself: it parses the body against its schema,
renders the chat template, tokenizes once and caps max_tokens, then sends the core token ids and
typed sampling parameters (messages.Generate), and encodes the replies and events from the
engine's typed outputs. Every other /v1 request (models, embeddings, any model that speaks the
vLLM backend's tensors: model.py, ensembles) goes to the core whole, as before: answered there
by the same OpenAI frontend, with the same words.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, NamedTuple

from tritonclient.grpc import model_config_pb2 as mc

from oceanus.core.errors import not_found
from oceanus.core.generation import GenerationInfo
from oceanus.core.types import InferRequest, InferResponse
from oceanus.frontends.http.protocol import HttpRequest, Pending
from oceanus.frontends.openai import OpenAIFrontend
from oceanus.frontends.workers.client import CoreClient
from oceanus.frontends.workers.mirror import Generating


class _Version(NamedTuple):
    """What the OpenAI routes read of a resolved version."""

    version: int
    path: Path
    config: mc.ModelConfig


class WorkerCore:
    """The OpenAI frontend's view of the core from a worker: the mirrored typed-engine models,
    and their requests sent over the worker's link."""

    def __init__(self, client: CoreClient) -> None:
        self._client = client
        self._configs: dict[tuple[str, Generating], mc.ModelConfig] = {}

    def _found(self, name: str) -> Generating:
        found = self._client.mirror.generating.get(name)
        if found is None:  # forwarded before this is asked, unless it unloaded meanwhile
            raise not_found(f"Request for unknown model: '{name}' is not found")
        return found

    def ready(self) -> bool:
        return True  # only asked on --openai-port, which the core serves

    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return []  # /v1/models goes to the core

    def resolve(self, name: str, version: str = "") -> _Version:
        found = self._found(name)
        return _Version(found.version, Path(found.path), self.model_config(name))

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        return {"inputs": [{"name": tensor} for tensor in self._found(name).inputs]}

    def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        found = self._found(name)
        config = self._configs.get((name, found))
        if config is None:
            config = mc.ModelConfig(name=name)
            if found.tool_call_parser is not None:
                config.parameters["tool_call_parser"].string_value = found.tool_call_parser
            if found.reasoning_parser is not None:
                config.parameters["reasoning_parser"].string_value = found.reasoning_parser
            self._configs[(name, found)] = config
        return config

    def generation_info(self, name: str, version: str = "") -> GenerationInfo | None:
        found = self._client.mirror.generating.get(name)
        if found is None:
            return None
        return GenerationInfo(found.max_model_len, Path(found.tokenizer_folder))

    def infer_stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        return self._client.generate(request)


def worker_openai(
    client: CoreClient,
    chat_template: str | None,
    restrictions: dict[str, tuple[str, str]] | None,
    max_input_size: int,
) -> OpenAIFrontend:
    """The OpenAI frontend a worker runs: what it cannot plan itself goes to the core whole."""

    def forward(request: HttpRequest) -> Pending:
        return Pending(client.http(request), lambda future: future.result())

    return OpenAIFrontend(
        WorkerCore(client), chat_template, restrictions, max_input_size, forward=forward
    )
