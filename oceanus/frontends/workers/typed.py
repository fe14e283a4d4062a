"""A typed language-model request between a frontend worker and the core, as plain values.

A worker that planned a chat or completion (openai_routes.py) sends `Generate`: the prompt's
token ids and SamplingParams' fields in order; the core answers with each GenerationOutput's
fields (`Generated`). Both ends read the field order from the dataclasses, so it cannot drift.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from oceanus.core.generation import GenerationOutput, GenerationRequest, SamplingParams
from oceanus.core.types import InferRequest, Tensor
from oceanus.frontends.workers.messages import Generate

_SAMPLING = tuple(f.name for f in dataclasses.fields(SamplingParams))
_OUTPUT = tuple(f.name for f in dataclasses.fields(GenerationOutput))


def generate_message(call_id: int, request: InferRequest) -> Generate:
    typed = request.generation
    assert typed is not None
    sampling = tuple(getattr(typed.sampling, name) for name in _SAMPLING)
    return Generate(
        call_id,
        request.model_name,
        request.id,
        typed.prompt_token_ids,
        sampling,
        typed.stream,
        typed.return_logprobs,
    )


def generation_request(message: Generate) -> InferRequest:
    """The core's request for a worker's Generate (`text_input` empty: the config requires it)."""
    sampling = SamplingParams(*message.sampling)
    typed = GenerationRequest(list(message.prompt_ids), sampling, message.stream, message.logprobs)
    empty = Tensor("text_input", "BYTES", (1,), np.array([b""], dtype=np.object_))
    return InferRequest(message.model, "", id=message.request_id, inputs=[empty], generation=typed)


def output_fields(output: GenerationOutput) -> tuple[Any, ...]:
    return tuple(getattr(output, name) for name in _OUTPUT)


def output_of(fields: tuple[Any, ...]) -> GenerationOutput:
    return GenerationOutput(*fields)
