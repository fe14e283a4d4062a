"""What the encoder models (embedder.py, classifier.py) share at the request's edges: the JSON
document a request carries in one string input (the OpenAI frontend's embedding and score
requests), the vLLM backend's text outputs, and answering through each job's stream (the
folders are decoupled, as the vLLM backend's config is)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from oceanus.core.backend import RequestJob, RequestsResult
from oceanus.core.errors import InferenceServerError, invalid_arg

Answer = dict[str, np.ndarray] | InferenceServerError


def json_input(job: RequestJob, name: str, model: str, does: str) -> Any:
    """The JSON document in the string input `name`; INVALID_ARG when it is missing or not
    JSON (`does` says what the model does, for the message)."""
    raw = job.inputs.get(name)
    if raw is None or raw.size == 0:
        raise invalid_arg(f"model '{model}' {does}: send the '{name}' input")
    value = raw.reshape(-1)[0]
    try:
        return json.loads(value.decode() if isinstance(value, bytes) else str(value))
    except ValueError as exc:
        raise invalid_arg(f"{name} is not valid JSON: {exc}") from None


def text_outputs(payload: Any, input_tokens: int) -> dict[str, np.ndarray]:
    """The vLLM backend's outputs carrying a JSON answer: `text_output`, the token counts."""
    return {
        "text_output": np.array([json.dumps(payload).encode()], np.object_),
        "num_input_tokens": np.array([input_tokens], dtype=np.uint32),
        "num_output_tokens": np.array([0], dtype=np.uint32),
    }


def deliver(jobs: Sequence[RequestJob], answers: Sequence[Answer]) -> RequestsResult:
    """Each job's answer, through its stream where it has one (then an empty output)."""
    delivered: list[Answer] = []
    for job, answer in zip(jobs, answers, strict=True):
        if job.stream is None:
            delivered.append(answer)
        elif isinstance(answer, InferenceServerError):
            job.stream.send(None, answer, True)
            delivered.append({})
        else:
            job.stream.send(answer, None, True)
            delivered.append({})
    return RequestsResult(outputs=delivered)
