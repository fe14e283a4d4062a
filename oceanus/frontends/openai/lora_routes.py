"""vLLM's LoRA surface on the OpenAI API: a request's `model` may name an adapter (its base
model runs it), `/v1/models` lists the adapters (`root`: the folder, `parent`: the base model),
and `/v1/load_lora_adapter` / `/v1/unload_lora_adapter` exist only while the environment's
VLLM_ALLOW_RUNTIME_LORA_UPDATING is true (vLLM's switch), with vLLM's words and status codes."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import orjson

from oceanus.core import lora
from oceanus.core.errors import ErrorCode, InferenceServerError
from oceanus.frontends.http.protocol import HttpResponse
from oceanus.frontends.openai.errors import OpenAIError, model_not_found

ROUTES = ("load_lora_adapter", "unload_lora_adapter")


def runtime_updating() -> bool:
    """vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING ("1" or "true"), read when asked."""
    return os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "0").strip().lower() in ("1", "true")


def adapters(core: Any) -> dict[str, tuple[str, str]]:
    """Adapter name -> (base model, folder); none where the core has no models of its own (a
    frontend worker forwards adapter requests to the core)."""
    if not hasattr(core, "ready_versions"):
        return {}
    public = getattr(core, "public_name", None)  # `oceanus serve`'s served names
    found = lora.adapters(core)
    return {name: (public(base) if public else base, path) for name, (base, path) in found.items()}


def target(core: Any, name: str) -> tuple[str, str | None]:
    """The model a request's `model` runs on, and the adapter it names (None: a model)."""
    try:
        core.resolve(name)
        return name, None
    except InferenceServerError as exc:
        if exc.code is not ErrorCode.NOT_FOUND:
            raise
    found = adapters(core).get(name)
    if found is None:
        raise model_not_found(name)
    return found[0], name


def card(name: str, base: str, folder: str, created: int) -> dict[str, Any]:
    """An adapter's entry in /v1/models, as vLLM's."""
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "oceanus",
        "root": folder,
        "parent": base,
        "max_model_len": None,
    }


def _fields(data: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(data or b"{}")
    except orjson.JSONDecodeError as exc:
        raise OpenAIError(400, f"invalid JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise OpenAIError(400, "the body must be a JSON object")
    return body


def _error(exc: InferenceServerError) -> OpenAIError:
    status = 404 if exc.code is ErrorCode.NOT_FOUND else 400
    kind = "NotFoundError" if status == 404 else "BadRequestError"
    return OpenAIError(status, exc.message, None, kind)


async def route(core: Any, route: str, data: bytes) -> HttpResponse:
    """POST /v1/load_lora_adapter or /v1/unload_lora_adapter: 200 with vLLM's plain text."""
    body = _fields(data)
    name = body.get("lora_name")
    if route == "load_lora_adapter":
        path = body.get("lora_path")
        if not name or not path:
            raise OpenAIError(
                400, "Both 'lora_name' and 'lora_path' must be provided.", None, "InvalidUserInput"
            )
        base = body.get("base_model_name") or None
        if base and hasattr(core, "internal_name"):
            base = core.internal_name(base)
        try:
            await asyncio.to_thread(lora.load, core, str(name), str(path), base)
        except InferenceServerError as exc:
            raise _error(exc) from None
        text = f"Success: LoRA adapter '{name}' added successfully."
    else:
        if not name and not body.get("lora_int_id"):
            raise OpenAIError(
                400,
                "either 'lora_name' and 'lora_int_id' needs to be provided.",
                None,
                "InvalidUserInput",
            )
        try:
            lora.unload(core, str(name))
        except InferenceServerError as exc:
            raise _error(exc) from None
        text = f"Success: LoRA adapter '{name}' removed successfully."
    return HttpResponse(200, text.encode(), [(b"content-type", b"text/plain; charset=utf-8")])
