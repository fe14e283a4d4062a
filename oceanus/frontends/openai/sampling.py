"""OpenAI request fields -> the vLLM backend's tensors (`text_input`, `stream`,
`sampling_parameters` as JSON, `exclude_input_in_output`, `return_*`), or for the built-in
engine a typed request (token ids, the core's SamplingParams); checked first so that a mistake
is a 400 naming the field, before anything is queued."""

from __future__ import annotations

from typing import Any

import numpy as np

from oceanus.core.generation import GenerationRequest, SamplingParams
from oceanus.core.types import InferRequest, Tensor
from oceanus.frontends.openai.errors import bad_request

# Fields passed through to the engine as they are (vLLM's names; the last ones are vLLM's own
# extensions to OpenAI's requests, as its OpenAI server accepts them).
_NUMBERS = ("temperature", "top_p", "presence_penalty", "frequency_penalty")
_EXTRAS = ("top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos")
# Fields OpenAI defines that change nothing here (accepted, not refused).
IGNORED = ("user", "store", "metadata", "service_tier", "parallel_tool_calls")


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


def sampling_parameters(
    body: dict[str, Any], max_tokens: int | None, vocab_size: int | None = None
) -> dict[str, Any]:
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
    bias = logit_bias(body, vocab_size)
    if bias:
        parameters["logit_bias"] = bias
    if max_tokens is not None:
        parameters["max_tokens"] = max_tokens
    return parameters


def logit_bias(body: dict[str, Any], vocab_size: int | None) -> dict[str, float]:
    """OpenAI's `logit_bias`: token id (a JSON key, so text) -> a bias in [-100, 100] added to
    that token's logit; ids the model's tokenizer does not have are a 400, as OpenAI's."""
    value = body.get("logit_bias")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_request("'logit_bias' must be an object of token id: bias", "logit_bias")
    bias: dict[str, float] = {}
    for key, number in value.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise bad_request(
                f"'logit_bias' keys must be token ids, got {key!r}", "logit_bias"
            ) from None
        if token < 0 or (vocab_size is not None and token >= vocab_size):
            raise bad_request(
                f"'logit_bias' names a token id out of the vocabulary: {token}", "logit_bias"
            )
        if (
            isinstance(number, bool)
            or not isinstance(number, (int, float))
            or not -100 <= number <= 100
        ):
            raise bad_request(
                f"'logit_bias' values must be numbers in [-100, 100], got {number!r}", "logit_bias"
            )
        bias[str(token)] = float(number)
    return bias


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


def typed_request(
    model: str,
    version: str,
    prompt_ids: list[int],
    stream: bool,
    parameters: dict[str, Any],
    logprobs: bool,
    request_id: str,
) -> InferRequest:
    """The built-in engine's request: the prompt's token ids and typed sampling parameters
    (its responses carry a GenerationOutput). `text_input` goes empty: the config requires it."""
    sampling = SamplingParams.from_mapping(parameters)
    return InferRequest(
        model,
        version,
        id=request_id,
        inputs=[_text("text_input", "")],
        generation=GenerationRequest(prompt_ids, sampling, stream, logprobs),
    )


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
