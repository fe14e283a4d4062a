"""vLLM's server routes beside the OpenAI ones: `POST /tokenize` and `POST /detokenize` (with
vLLM's request and response shapes), `GET /health` (200, empty) and `GET /version`.

`/tokenize` takes a completion's `prompt` (special tokens added, as a completion's prompt is)
or a chat's `messages` (rendered with the model's chat template, none added, as the chat route
does): the ids are the ones the chat and completion routes would send the engine."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from oceanus import __version__
from oceanus.frontends.openai import plans
from oceanus.frontends.openai.errors import bad_request
from oceanus.frontends.openai.protocol import Message, Schema, Tool, parse
from oceanus.frontends.openai.tokenizer import ModelTokenizer

if TYPE_CHECKING:
    from oceanus.frontends.openai.app import OpenAIFrontend


class TokenizeRequest(Schema):
    """vLLM's TokenizeCompletionRequest and TokenizeChatRequest in one: `prompt` or `messages`."""

    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    tools: list[Tool] | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool | None = None  # a prompt's default: true; messages': false
    return_token_strs: bool = False


class DetokenizeRequest(Schema):
    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0)]]


def version() -> dict[str, str]:
    return {"version": __version__}


async def tokenize(frontend: OpenAIFrontend, data: bytes) -> dict[str, Any]:
    body = parse(TokenizeRequest, data)
    if (body.prompt is None) == (body.messages is None):
        raise bad_request("give either 'prompt' or 'messages'", "prompt")
    found = await _tokenizer(frontend, body.model)
    if body.messages is not None:
        messages = plans.template_messages(body.messages)
        tools = [tool.model_dump(exclude_none=True) for tool in body.tools or []] or None
        text = found.render_chat(messages, tools, body.add_generation_prompt)
        special = bool(body.add_special_tokens)
    else:
        text = body.prompt or ""
        special = body.add_special_tokens is not False
    ids = found.encode(text, special)
    strings = [found.tokenizer.id_to_token(i) for i in ids] if body.return_token_strs else None
    return {
        "count": len(ids),
        "max_model_len": found.context_length,
        "tokens": ids,
        "token_strs": strings,
    }


async def detokenize(frontend: OpenAIFrontend, data: bytes) -> dict[str, Any]:
    body = parse(DetokenizeRequest, data)
    found = await _tokenizer(frontend, body.model)
    if any(token >= found.vocab_size for token in body.tokens):
        raise bad_request("'tokens' has an id out of the model's vocabulary", "tokens")
    return {"prompt": found.decode(body.tokens)}


async def _tokenizer(frontend: OpenAIFrontend, model: str | None) -> ModelTokenizer:
    """The named model's tokenizer; without a name, the one model served (as vLLM serves one)."""
    if model is None:
        names = sorted({item["name"] for item in frontend.core.repository_index(ready_only=True)})
        if len(names) != 1:
            raise bad_request(f"name the 'model' (this server has {len(names)})", "model")
        model = names[0]
    found = await frontend.model_tokenizer(model)
    if found is None:
        raise bad_request(f"model '{model}' has no tokenizer.json in its folder", "model")
    return found
