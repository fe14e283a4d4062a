"""Routing of the OpenAI-compatible API, and each model's tokenizer (cached per loaded version).

`handle` answers `/v1/...` on the HTTP port (the HTTP frontend hands those paths here) and on
`--openai-port`, where `/health/ready` answers too, as on Triton's frontend. A streaming reply is
a `Streamed` outcome (it also travels through the frontend worker processes); a whole reply is a
`Pending` one. The connection closing cancels either, and with it the core requests.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import orjson

from oceanus.core.errors import ErrorCode, InferenceServerError
from oceanus.core.generation import GenerationInfo
from oceanus.core.types import InferRequest, InferResponse
from oceanus.frontends.http.infer import request_body
from oceanus.frontends.http.protocol import HttpRequest, HttpResponse, Pending, Streamed
from oceanus.frontends.openai import (
    anthropic,
    generation,
    lora_routes,
    plans,
    reasoning,
    replies,
    responses,
    sampling,
    score_routes,
    tokenize_routes,
    tokenizer,
    tools,
)
from oceanus.frontends.openai.errors import (
    OpenAIError,
    as_openai_error,
    bad_request,
    model_not_found,
)
from oceanus.frontends.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    parse,
)
from oceanus.frontends.openai.tokenizer import ModelTokenizer

Outcome = HttpResponse | Pending | Streamed
# --http-restricted-api groups of the OpenAI routes.
_GROUPS = {"models": "metadata", "chat": "inference", "completions": "inference"}
_GROUPS |= {"embeddings": "inference", "responses": "inference", "messages": "inference"}
_GROUPS |= {"score": "inference", "rerank": "inference"}
# vLLM's routes outside /v1, and their --http-restricted-api groups.
SERVER_ROUTES = {"/health": "health", "/version": "metadata"}
SERVER_ROUTES |= {"/tokenize": "inference", "/detokenize": "inference"}
SERVER_ROUTES |= {"/score": "inference", "/rerank": "inference", "/v2/rerank": "inference"}
# vLLM's model permission object (what /v1/models lists; nothing here acts on it).
_PERMISSION = {"object": "model_permission", "allow_create_engine": False, "allow_sampling": True}
_PERMISSION |= {"allow_logprobs": True, "allow_search_indices": False, "allow_view": True}
_PERMISSION |= {"allow_fine_tuning": False, "organization": "*", "group": None}
_PERMISSION["is_blocking"] = False
# The routes a frontend worker may answer itself (for a model whose engine takes typed requests).
_PLANNED = ("chat/completions", "completions")


class OpenAICore(Protocol):
    """What the routes read of the core: ServerCore itself, or in a frontend worker the
    mirror of the models whose engine takes typed requests (workers/openai_routes.py)."""

    def ready(self) -> bool: ...

    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]: ...

    def resolve(self, name: str, version: str = "") -> Any: ...

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]: ...

    def model_config(self, name: str, version: str = "") -> Any: ...

    def generation_info(self, name: str, version: str = "") -> GenerationInfo | None: ...

    def infer_stream(self, request: InferRequest) -> AsyncIterator[InferResponse]: ...


def _finish(future: asyncio.Future[Any]) -> HttpResponse:
    exc = future.exception()
    if exc is not None:
        return as_openai_error(exc).response()
    response: HttpResponse = future.result()
    return response


class OpenAIFrontend:
    def __init__(
        self,
        core: OpenAICore,
        chat_template: str | None = None,
        restrictions: dict[str, tuple[str, str]] | None = None,
        max_input_size: int = 64 * 1024 * 1024,
        forward: Callable[[HttpRequest], Outcome] | None = None,
    ) -> None:
        self.core = core
        # In a frontend worker: what the core answers (every route but a chat or completion
        # for a model whose engine takes typed requests, which the worker plans itself).
        self.forward = forward
        self.chat_template = tokenizer.read_chat_template(chat_template) if chat_template else None
        self.restrictions = {
            category: (header.encode("latin-1"), value.encode("latin-1"))
            for category, (header, value) in (restrictions or {}).items()
        }
        self.max_input_size = max_input_size
        # The Responses API's stored responses (store: true), for previous_response_id.
        self.responses = responses.ResponseStore()
        # One load per model version, shared by the requests that arrive while it runs.
        self._tokenizers: dict[tuple[str, int, str], asyncio.Future[ModelTokenizer | None]] = {}

    # ---- routing ----------------------------------------------------------------------------

    def handle_own_port(self, request: HttpRequest) -> Outcome:
        """`--openai-port`: the OpenAI routes, and Triton's frontend's health probe."""
        if request.path == "/health/ready":
            return HttpResponse(200 if self.core.ready() else 503)
        return self.handle(request)

    def handle(self, request: HttpRequest) -> Outcome:
        try:
            return self._dispatch(request)
        except Exception as exc:  # every failure answers in its API's shape (OpenAI's mostly)
            shape = (
                anthropic.SHAPE if request.path.startswith("/v1/messages") else replies.OPENAI_SHAPE
            )
            return shape.reply(exc)

    def _dispatch(self, request: HttpRequest) -> Outcome:
        parts = request.path.split("/")[1:]
        if request.path in SERVER_ROUTES:
            return self._server_route(request)
        if parts[:1] != ["v1"] or len(parts) < 2:
            raise OpenAIError(404, f"Not Found: {request.path}")
        head = parts[1]
        if self.forward is not None and "/".join(parts[1:]) not in _PLANNED:
            return self.forward(request)
        if self.restrictions:
            self._check_restriction(request, _GROUPS.get(head, ""))
        if head == "messages":  # Anthropic's Messages API (anthropic.py)
            return anthropic.route(self, request, parts[2:])
        if head == "responses":  # OpenAI's Responses API (responses.py)
            return responses.route(self, request, parts[2:])
        if head == "models":
            _require(request, "GET")
            if len(parts) == 2:
                return replies.json_reply(self._models())
            return replies.json_reply(self._model(parts[2]))
        route = "/".join(parts[1:])
        if route in lora_routes.ROUTES and lora_routes.runtime_updating():
            _require(request, "POST")
            work = lora_routes.route(self.core, route, request_body(request, self.max_input_size))
            return Pending(asyncio.ensure_future(work), _finish)
        if route in ("score", "rerank"):
            return self._score(request, route)
        if route not in ("chat/completions", "completions", "embeddings"):
            raise OpenAIError(404, f"Not Found: {request.path}")
        _require(request, "POST")
        data = request_body(request, self.max_input_size)
        if route == "embeddings":
            embedding = parse(EmbeddingRequest, data)
            return Pending(asyncio.ensure_future(self._embeddings(embedding)), _finish)
        body: ChatCompletionRequest | CompletionRequest = (
            parse(ChatCompletionRequest, data)
            if route == "chat/completions"
            else parse(CompletionRequest, data)
        )
        if self.forward is not None and self.core.generation_info(body.model) is None:
            return self.forward(request)
        if body.stream:
            return Streamed(replies.stream_reply(self._events(body), replies.OPENAI_SHAPE))
        return Pending(asyncio.ensure_future(self._generate(body)), _finish)

    def _server_route(self, request: HttpRequest) -> Outcome:
        """vLLM's routes outside /v1 (tokenize_routes.py)."""
        path = request.path
        if self.forward is not None:
            return self.forward(request)
        if self.restrictions:
            self._check_restriction(request, SERVER_ROUTES[path])
        if path == "/health":
            _require(request, "GET")
            return HttpResponse(200 if self.core.ready() else 503)
        if path == "/version":
            _require(request, "GET")
            return replies.json_reply(tokenize_routes.version())
        if path in ("/score", "/rerank", "/v2/rerank"):
            return self._score(request, path.rsplit("/", 1)[1])
        _require(request, "POST")
        data = request_body(request, self.max_input_size)
        route = tokenize_routes.tokenize if path == "/tokenize" else tokenize_routes.detokenize
        return replies.pending(route(self, data), replies.OPENAI_SHAPE)

    def _score(self, request: HttpRequest, route: str) -> Outcome:
        """vLLM's /v1/score and /v1/rerank (score_routes.py), also as /score, /rerank and
        /v2/rerank, as vLLM's."""
        _require(request, "POST")
        data = request_body(request, self.max_input_size)
        work = score_routes.score if route == "score" else score_routes.rerank
        return replies.pending(work(self, data), replies.OPENAI_SHAPE)

    def _check_restriction(self, request: HttpRequest, group: str) -> None:
        """--http-restricted-api: the group's header, with the HTTP frontend's words."""
        rule = self.restrictions.get(group)
        if rule is not None and request.headers.get(rule[0]) != rule[1]:
            header = rule[0].decode("latin-1")
            raise OpenAIError(403, f"This API is restricted, expecting header '{header}'")

    # ---- models -----------------------------------------------------------------------------

    def _models(self) -> dict[str, Any]:
        names = sorted({item["name"] for item in self.core.repository_index(ready_only=True)})
        data = [self._model_document(name) for name in names]
        created = int(time.time())
        for adapter, (base, folder) in sorted(lora_routes.adapters(self.core).items()):
            data.append(lora_routes.card(adapter, base, folder, created))
        return {"object": "list", "data": data}

    def _model(self, name: str) -> dict[str, Any]:
        base, adapter = lora_routes.target(self.core, name)
        if adapter is not None:
            folder = lora_routes.adapters(self.core)[name][1]
            return lora_routes.card(name, base, folder, int(time.time()))
        return self._model_document(name)

    def _model_document(self, name: str) -> dict[str, Any]:
        """OpenAI's model object, with vLLM's `root`, `parent` and `max_model_len`."""
        info = self.core.generation_info(name)
        if info is not None:
            length: int | None = info.max_model_len
        else:
            length = tokenizer.max_model_len(Path(self._resolve(name).path))
        created = int(time.time())
        return {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "oceanus",
            "root": name,
            "parent": None,
            "max_model_len": length,
            "permission": [
                {**_PERMISSION, "id": f"modelperm-{uuid.uuid4().hex}", "created": created}
            ],
        }

    def _resolve(self, name: str) -> Any:
        try:
            return self.core.resolve(name)
        except InferenceServerError as exc:
            if exc.code is ErrorCode.NOT_FOUND:
                raise model_not_found(name) from None
            raise

    def model_inputs(self, name: str) -> set[str]:
        """The names of a model's inputs (which routes it can serve); 404 for an unknown one."""
        self._resolve(name)
        return {spec["name"] for spec in self.core.model_metadata(name)["inputs"]}

    def _require_inputs(self, name: str, *inputs: str) -> None:
        have = {spec["name"] for spec in self.core.model_metadata(name)["inputs"]}
        missing = [n for n in inputs if n not in have]
        if missing:
            raise bad_request(
                f"model '{name}' cannot serve this route: it has no input "
                f"{', '.join(repr(m) for m in missing)} (the vLLM backend's tensors)",
                "model",
            )

    async def model_tokenizer(self, name: str) -> ModelTokenizer | None:
        version = self._resolve(name)
        key = (name, version.version, str(version.path))
        loading = self._tokenizers.get(key)
        if loading is None or (loading.done() and loading.exception() is not None):
            # The built-in engine's own tokenizer and context length first: one of each.
            info = self.core.generation_info(name)
            folders = [info.tokenizer_folder] if info is not None else []
            folders += tokenizer.candidate_folders(Path(version.path), Path(version.path).parent)
            for step in version.config.ensemble_scheduling.step:  # an ensemble's models
                try:
                    inner = self.core.resolve(step.model_name)
                except InferenceServerError:
                    continue
                folders += tokenizer.candidate_folders(Path(inner.path), Path(inner.path).parent)
            length = (
                info.max_model_len
                if info is not None
                else tokenizer.max_model_len(Path(version.path))
            )
            loading = asyncio.ensure_future(
                asyncio.to_thread(tokenizer.load_tokenizer, folders, self.chat_template, length)
            )
            self._tokenizers[key] = loading
        # shielded: a client that leaves does not cancel the load the others wait for
        return await asyncio.shield(loading)

    # ---- chat and completions ---------------------------------------------------------------

    async def plan(self, body: ChatCompletionRequest | CompletionRequest) -> tuple[plans.Plan, Any]:
        name, adapter = lora_routes.target(self.core, body.model)
        found = await self.model_tokenizer(name)
        self._require_inputs(name, "text_input")
        # The engine takes the ids tokenized here when they come from its own tokenizer.
        info = self.core.generation_info(name)
        typed = (
            info is not None
            and found is not None
            and found.folder.resolve() == info.tokenizer_folder.resolve()
        )
        if isinstance(body, ChatCompletionRequest):
            if found is None:
                raise bad_request(
                    f"model '{name}' has no tokenizer.json in its folder: chat needs its "
                    "tokenizer and chat template",
                    "model",
                )
            config = self.core.model_config(name)
            chosen = config.parameters.get("tool_call_parser")
            parser: tools.Parser | None = None
            if chosen is not None and chosen.string_value in tools.PARSERS:
                parser = tools.PARSERS[chosen.string_value]()
            else:
                parser = tools.parser_for_template(found.chat_template)
            thinking = reasoning.parser_for_config(config)
            # Rendering the template and tokenizing the prompt take milliseconds per request
            # (3-4 ms for 300 tokens): on the event loop, a burst of 32 chats held every other
            # connection, health probes included, for hundreds of ms. A worker thread instead.
            plan = await asyncio.to_thread(plans.chat_plan, body, found, parser, typed, thinking)
        else:
            plan = await asyncio.to_thread(plans.completion_plan, body, found, typed)

        if adapter is not None:
            plan.model, plan.base = adapter, name
            plan.parameters["lora_name"] = adapter

        def count(text: str) -> int:  # a completion's tokens, when the model did not say
            return len(found.encode(text, False)) if found is not None and text else 0

        return plan, count

    async def _generate(self, body: ChatCompletionRequest | CompletionRequest) -> HttpResponse:
        plan, count = await self.plan(body)
        return replies.json_reply(await generation.complete(self.core, plan, count))

    async def _events(
        self, body: ChatCompletionRequest | CompletionRequest
    ) -> AsyncGenerator[bytes, None]:
        plan, count = await self.plan(body)
        async with contextlib.aclosing(generation.stream_events(self.core, plan, count)) as events:
            async for part in events:
                yield part

    # ---- chat for the other APIs (responses.py, anthropic.py) -------------------------------

    async def chat(self, body: ChatCompletionRequest) -> tuple[plans.Plan, dict[str, Any]]:
        """A chat completion (one choice) through the chat route's plan: its document."""
        plan, count = await self.plan(body)
        return plan, await generation.complete(self.core, plan, count)

    async def chat_chunks(
        self, body: ChatCompletionRequest
    ) -> tuple[plans.Plan, AsyncGenerator[dict[str, Any], None]]:
        """A streaming chat through the chat route's plan: its chunks, as documents."""
        plan, count = await self.plan(body)
        return plan, generation.chunks(self.core, plan, count)

    # ---- embeddings -------------------------------------------------------------------------

    async def _embeddings(self, body: EmbeddingRequest) -> HttpResponse:
        name = body.model
        items: list[Any] = (
            [body.input]
            if isinstance(body.input, str) or isinstance(body.input[0], int)
            else list(body.input)
        )
        vectors, prompt_tokens = await self.embed(name, items, body.dimensions)
        data = []
        for number, vector in enumerate(vectors):
            value: Any = vector.tolist()
            if body.encoding_format == "base64":
                value = base64.b64encode(vector.astype("<f4").tobytes()).decode()
            data.append({"object": "embedding", "index": number, "embedding": value})
        usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
        return replies.json_reply({"object": "list", "data": data, "model": name, "usage": usage})

    async def embed(
        self, name: str, items: list[Any], dimensions: int | None = None
    ) -> tuple[list[np.ndarray], int]:
        """Each item's vector (a text or token ids) from an embedding model; the input tokens."""
        self._resolve(name)
        self._require_inputs(name, "embedding_request")
        if self.core.generation_info(name) is not None:
            # As vLLM: a generating model embeds only when served as a pooling model (vLLM
            # then serves no generation either); vLLM's server has no such route then (404).
            raise bad_request(
                f"model '{name}' is a generative model (it has a language-model head): it "
                "serves chat and completions, not embeddings. Serve it as an embedding model "
                'with model.json\'s "runner": "pooling" (vLLM\'s --runner pooling; the last '
                "token's hidden state, normalized), or serve an embedding model",
                "model",
            )
        text_input = any(
            spec["name"] == "text_input" for spec in self.core.model_metadata(name)["inputs"]
        )
        requests = []
        for number, item in enumerate(items):
            document: dict[str, Any] = {"input": item}
            if dimensions is not None:
                document["pooling_params"] = {"dimensions": [dimensions]}
            request = sampling.embedding_request(
                name, "", document, f"embd-{uuid.uuid4().hex}-{number}", text_input
            )
            requests.append(_one_response(self.core.infer_stream(request)))
        vectors, prompt_tokens = [], 0
        for response in await asyncio.gather(*requests):
            vector, tokens = _embedding(response)
            vectors.append(vector)
            prompt_tokens += tokens
        return vectors, prompt_tokens


async def _one_response(responses: AsyncIterator[Any]) -> Any:
    found = None
    async for response in responses:
        found = found or (response if response.outputs else None)
    if found is None:
        raise OpenAIError(500, "the model sent no embedding")
    return found


def _embedding(response: Any) -> tuple[np.ndarray, int]:
    """The vLLM backend's embedding: a JSON list in `text_output`; its input token count."""
    vector, tokens = None, 0
    for tensor in response.outputs:
        value = tensor.data.reshape(-1)[0]
        if tensor.name == "text_output":
            vector = np.asarray(orjson.loads(value), dtype=np.float32)
        elif tensor.name == "num_input_tokens":
            tokens = int(value)
    if vector is None:
        raise OpenAIError(500, "the model's response has no 'text_output'")
    return vector, tokens


def _require(request: HttpRequest, method: str) -> None:
    if request.method != method:
        raise OpenAIError(405, f"Method Not Allowed: {request.method} {request.path}")
