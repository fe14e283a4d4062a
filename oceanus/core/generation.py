"""A language model's typed request and response, for engines that take token ids.

The tensor form of Triton's vLLM backend (`text_input`, a JSON `sampling_parameters`, JSON
`logprobs`, `finish_reason` as text) stays what Triton's generate endpoint, Python models and
ensembles speak. An engine that tokenizes nothing itself publishes a `GenerationInfo` (its
context length and tokenizer folder); a frontend that sees one tokenizes the prompt once and
sends `prompt_token_ids` with typed `SamplingParams` on the request (`InferRequest.generation`),
and reads each response's `GenerationOutput` (`InferResponse.generation`): no JSON per request
or per token, and one tokenizer and one context length, as vLLM's server hands its engine.

`SamplingParams` is vLLM's, with its names and defaults; `from_mapping` is the one parser of the
`sampling_parameters` document, for the backend's tensor form and the frontends alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from oceanus.core.errors import invalid_arg


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None  # how many top alternatives per token (0: only the chosen one)
    # vLLM's: the prompt's tokens' logprobs with this many alternatives (None: not computed; the
    # engine then keeps the LM head to the prompt's last row, as for every other request).
    prompt_logprobs: int | None = None
    # Structured output as asked: the JSON text of vLLM's GuidedDecodingParams.
    guided_decoding: str | None = None
    # The llguidance grammar the engine compiled from `guided_decoding` (the backend sets it).
    guided: str | None = None
    # (token id, bias) pairs added to the logits before anything else (OpenAI's logit_bias).
    logit_bias: tuple[tuple[int, float], ...] = ()
    # The LoRA adapter to run (None: the base model): Triton's vLLM backend reads it from the
    # sampling parameters; the OpenAI frontend sets it when `model` names an adapter.
    lora_name: str | None = None
    # Keys vLLM accepts that this engine does not act on (kept so a request is not refused).
    ignored: tuple[str, ...] = field(default=())

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> SamplingParams:
        """vLLM's names -> checked parameters; raises INVALID_ARG naming the bad key. Triton
        clients often send every value as a string ("max_tokens": "64"): converted as vLLM's
        backend converts them."""
        values: dict[str, Any] = {}
        ignored: list[str] = []
        for name, value in raw.items():
            if value is None:
                continue
            if name in _INT:
                values[name] = _number(name, value, int)
            elif name in _FLOAT:
                values[name] = _number(name, value, float)
            elif name == "ignore_eos":
                values[name] = _bool(name, value)
            elif name == "stop":
                stops = [value] if isinstance(value, str) else value
                if not isinstance(stops, (list, tuple)) or not all(
                    isinstance(s, str) for s in stops
                ):
                    raise invalid_arg(
                        "sampling parameter 'stop' must be a string or a list of strings"
                    )
                values[name] = tuple(s for s in stops if s)
            elif name == "guided_decoding":
                import json

                values[name] = value if isinstance(value, str) else json.dumps(value)
            elif name == "logit_bias":
                values[name] = _logit_bias(value)
            elif name == "lora_name":
                if not isinstance(value, str):
                    raise invalid_arg("sampling parameter 'lora_name' must be a string")
                values[name] = value or None
            elif name in _IGNORED:
                ignored.append(name)
            else:
                raise invalid_arg(f"unknown sampling parameter '{name}'")
        params = cls(**values, ignored=tuple(ignored))
        params.check()
        return params

    def check(self) -> None:
        problems: list[str] = []
        if self.max_tokens < 1:
            problems.append(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.min_tokens < 0 or self.min_tokens > self.max_tokens:
            problems.append(
                f"min_tokens must be between 0 and max_tokens={self.max_tokens}, "
                f"got {self.min_tokens}"
            )
        if self.temperature < 0:
            problems.append(f"temperature must be non-negative, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            problems.append(f"top_k must be -1 (disable), or at least 1, got {self.top_k}")
        if self.repetition_penalty <= 0:
            problems.append(
                f"repetition_penalty must be greater than zero, got {self.repetition_penalty}"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2 <= value <= 2:
                problems.append(f"{name} must be in [-2, 2], got {value}")
        if any(not -100 <= bias <= 100 for _, bias in self.logit_bias):
            problems.append("logit_bias values must be in [-100, 100]")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and value < 0:
                problems.append(f"{name} must be non-negative, got {value}")
        if problems:
            raise invalid_arg("invalid sampling parameters: " + "; ".join(problems))


_INT = ("max_tokens", "min_tokens", "top_k", "seed", "logprobs", "prompt_logprobs")
_FLOAT = ("temperature", "top_p", "repetition_penalty", "presence_penalty", "frequency_penalty")
# vLLM SamplingParams fields a client may send that change nothing here.
_IGNORED = frozenset(
    {
        "n",
        "best_of",
        "stop_token_ids",
        "include_stop_str_in_output",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "min_p",
        "detokenize",
        "use_beam_search",
        "length_penalty",
    }
)


def _bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise invalid_arg(f"sampling parameter '{name}' must be a boolean, got {value!r}")


def _number(name: str, value: Any, kind: type) -> Any:
    if isinstance(value, bool):
        raise invalid_arg(f"sampling parameter '{name}' must be a number, got {value!r}")
    try:
        converted = kind(value)
    except (TypeError, ValueError):
        raise invalid_arg(f"sampling parameter '{name}' must be a number, got {value!r}") from None
    if kind is int and isinstance(value, float) and value != converted:
        raise invalid_arg(f"sampling parameter '{name}' must be an integer, got {value!r}")
    return converted


def _logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """{token id: bias}; ids may be strings, as JSON object keys are."""
    if not isinstance(value, Mapping):
        raise invalid_arg("sampling parameter 'logit_bias' must be an object of token id: bias")
    pairs = []
    for key, bias in value.items():
        token = _number("logit_bias", key, int)
        if token < 0:
            raise invalid_arg(f"sampling parameter 'logit_bias' has a negative token id: {key!r}")
        pairs.append((token, float(_number("logit_bias", bias, float))))
    return tuple(pairs)


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """What a frontend hands an engine that publishes `GenerationInfo`: the prompt tokenized
    once (with the tokenizer the engine named), and how to sample."""

    prompt_token_ids: list[int]
    sampling: SamplingParams
    stream: bool = True  # a response per step; False: one final response with the whole text
    # Each response carries its tokens' logprobs (sampling.logprobs says how many alternatives).
    return_logprobs: bool = False


# (token id, token text, logprob, rank in the vocabulary from 1)
PromptLogprob = tuple[int, str, float | None, int | None]


@dataclass(slots=True)
class GenerationOutput:
    """One response of an engine to a `GenerationRequest`."""

    text: str  # the new text (a non-streaming request: the whole completion)
    finish_reason: str | None  # None until the final response: "stop", "length", "abort"
    num_input_tokens: int
    num_output_tokens: int  # the tokens this response covers
    # Per new token: (token text, logprob) of the chosen token first, then the alternatives
    # from the most likely down (None: logprobs were not asked for).
    logprobs: list[list[tuple[str, float]]] | None = None
    # In the first response of a request with `prompt_logprobs`: per prompt token, (id, text,
    # logprob, rank) of that token first, then its alternatives from the most likely down. The
    # first token's logprob and rank are None (nothing precedes it), as vLLM's are.
    prompt_logprobs: list[list[PromptLogprob]] | None = None


@dataclass(frozen=True, slots=True)
class GenerationInfo:
    """What an engine that takes `GenerationRequest`s publishes at load (BackendInstance
    .generation_info): the one context length, and the folder of the tokenizer it detokenizes
    with (the frontend tokenizes prompts with the same one)."""

    max_model_len: int
    tokenizer_folder: Path


class LoraAdapters(Protocol):
    """An engine's LoRA adapters (the LLM backend's), by name: listed, loaded and unloaded at
    run time. `load` raises INVALID_ARG for an adapter refused, NOT_FOUND for no adapter at
    the path; `unload` NOT_FOUND for a name not loaded (its running requests finish)."""

    def adapters(self) -> dict[str, str]:
        """Name -> folder."""
        ...

    def load(self, name: str, path: str) -> None: ...

    def unload(self, name: str) -> None: ...
