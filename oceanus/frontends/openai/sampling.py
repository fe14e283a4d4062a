"""OpenAI request fields -> the vLLM backend's tensors (`text_input`, `stream`,
`sampling_parameters` as JSON, `exclude_input_in_output`, `return_*`), checked first so that a
mistake is a 400 naming the field, before anything is queued."""

from __future__ import annotations

from typing import Any

import numpy as np

from oceanus.core.types import InferRequest, Tensor
from oceanus.frontends.openai.errors import bad_request

# Fields passed through to the engine as they are (vLLM's names; the last ones are vLLM's own
# extensions to OpenAI's requests, as its OpenAI server accepts them).
_NUMBERS = ("temperature", "top_p", "presence_penalty", "frequency_penalty")
_EXTRAS = ("top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos")
# Fields OpenAI defines that change nothing here (accepted, not refused).
IGNORED = ("user", "store", "metadata", "service_tier", "parallel_tool_calls", "logit_bias")


def _number(body: dict[str, Any], key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad_request(f"'{key}' must be a number", key)
    if not low <= value <= high:
        raise bad_request(f"'{key}' must be between {low} and {high}, got {value}", key)
    return float(value)


def positive_int(body: dict[str, Any], key: str, minimum: int = 1) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise bad_request(f"'{key}' must be an integer >= {minimum}, got {value!r}", key)
    return value


def stop_list(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= 16:
        return list(stop)
    raise bad_request("'stop' must be a string or a list of at most 16 strings", "stop")


def sampling_parameters(body: dict[str, Any], max_tokens: int | None) -> dict[str, Any]:
    """The `sampling_parameters` document (vLLM's SamplingParams names)."""
    parameters: dict[str, Any] = {}
    limits = {"temperature": (0.0, 2.0), "top_p": (0.0, 1.0)}
    for key in _NUMBERS:
        low, high = limits.get(key, (-2.0, 2.0))
        value = _number(body, key, low, high)
        if value is not None:
            parameters[key] = value
    seed = body.get("seed")
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise bad_request("'seed' must be an integer", "seed")
        parameters["seed"] = seed
    stop = stop_list(body)
    if stop:
        parameters["stop"] = stop
    for key in _EXTRAS:
        if body.get(key) is not None:
            parameters[key] = body[key]
    if max_tokens is not None:
        parameters["max_tokens"] = max_tokens
    return parameters


def _bool(name: str, value: bool) -> Tensor:
    return Tensor(name, "BOOL", (1,), np.array([value], dtype=np.bool_))


def _text(name: str, value: str) -> Tensor:
    return Tensor(name, "BYTES", (1,), np.array([value.encode()], dtype=np.object_))


def generate_request(
    model: str,
    version: str,
    prompt: str,
    stream: bool,
    parameters: dict[str, Any],
    logprobs: bool,
    request_id: str,
) -> InferRequest:
    """The core request: the prompt alone in, the new text alone out (echo is the frontend's)."""
    inputs = [
        _text("text_input", prompt),
        _bool("stream", stream),
        _text("sampling_parameters", _dumps(parameters)),
        _bool("exclude_input_in_output", True),
        _bool("return_finish_reason", True),
        _bool("return_num_input_tokens", True),
        _bool("return_num_output_tokens", True),
    ]
    if logprobs:
        inputs.append(_bool("return_logprobs", True))
    return InferRequest(model, version, id=request_id, inputs=inputs)


def embedding_request(
    model: str, version: str, document: dict[str, Any], request_id: str, text_input: bool
) -> InferRequest:
    """The vLLM backend's embedding request: one JSON document in `embedding_request` (and an
    empty `text_input`, which that backend's config requires)."""
    inputs = [
        _text("embedding_request", _dumps(document)),
        _bool("return_num_input_tokens", True),
    ]
    if text_input:
        inputs.append(_text("text_input", ""))
    return InferRequest(model, version, id=request_id, inputs=inputs)


def _dumps(document: Any) -> str:
    import json

    return json.dumps(document, ensure_ascii=False)
