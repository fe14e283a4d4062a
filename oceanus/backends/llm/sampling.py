"""The `sampling_parameters` JSON of Triton's vLLM backend, parsed and checked (no torch here).

The parameters themselves and their checks are the core's (`oceanus.core.generation
.SamplingParams`, shared with the OpenAI frontend's typed requests); here the tensor's JSON
text is read, and a `guided_decoding` document compiled into the engine's grammar."""

from __future__ import annotations

import dataclasses
import json

from oceanus.core.errors import InferenceServerError, invalid_arg
from oceanus.core.generation import SamplingParams


def parse_sampling_parameters(text: str | bytes | None) -> SamplingParams:
    """Parse and check the JSON object; raises INVALID_ARG naming the bad key."""
    if text is None or text in ("", b""):
        return SamplingParams()
    try:
        raw = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid_arg(f"sampling_parameters is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise invalid_arg("sampling_parameters must be a JSON object")
    return compile_guide(SamplingParams.from_mapping(raw))


def compile_guide(params: SamplingParams) -> SamplingParams:
    """The parameters with `guided` set: the llguidance grammar of `guided_decoding`."""
    if params.guided_decoding is None or params.guided is not None:
        return params
    from oceanus.backends.llm.guide import grammar_of

    return dataclasses.replace(params, guided=grammar_of(params.guided_decoding))


__all__ = ["InferenceServerError", "SamplingParams", "compile_guide", "parse_sampling_parameters"]
