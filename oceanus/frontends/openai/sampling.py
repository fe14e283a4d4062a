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


def logit_bias(value: dict[str, float] | None, vocab_size: int | None) -> dict[str, float]:
    """OpenAI's `logit_bias`: token id (a JSON key, so text) -> a bias in [-100, 100] added to
    that token's logit; ids the model's tokenizer does not have are a 400, as OpenAI's."""
    bias: dict[str, float] = {}
    for key, number in (value or {}).items():
        try:
            token = int(key)
        except ValueError:
            raise bad_request(
                f"'logit_bias' keys must be token ids, got {key!r}", "logit_bias"
            ) from None
        if token < 0 or (vocab_size is not None and token >= vocab_size):
            raise bad_request(
                f"'logit_bias' names a token id out of the vocabulary: {token}", "logit_bias"
            )
        if not -100 <= number <= 100:
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


def score_request(
    model: str, version: str, pairs: list[list[str]], request_id: str
) -> InferRequest:
    """A cross-encoder's request (the backend adds the `score_request` input to such models'
    configs): every (query, document) pair in one JSON document, scored in one batch."""
    inputs = [
        _text("score_request", _dumps({"pairs": pairs})),
        _bool("return_num_input_tokens", True),
        _text("text_input", ""),
    ]
    return InferRequest(model, version, id=request_id, inputs=inputs)


def _dumps(document: Any) -> str:
    import json

    return json.dumps(document, ensure_ascii=False)
