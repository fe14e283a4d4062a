"""The `sampling_parameters` JSON of Triton's vLLM backend, parsed and checked (no torch here).

Names and defaults follow vLLM's SamplingParams: `max_tokens` 16, `temperature` 1.0,
`top_p` 1.0, `top_k` 0 or -1 (off), penalties neutral. Triton clients often send every value
as a string ("max_tokens": "64"), so strings are converted as vLLM's backend converts them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from oceanus.core.errors import InferenceServerError, invalid_arg


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
    # Structured output: the llguidance grammar compiled from `guided_decoding` (guide.py).
    guided: str | None = None
    # (token id, bias) pairs added to the logits before anything else (OpenAI's logit_bias).
    logit_bias: tuple[tuple[int, float], ...] = ()
    # Keys vLLM accepts that this engine does not act on (kept so a request is not refused).
    ignored: tuple[str, ...] = field(default=())

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


_INT = ("max_tokens", "min_tokens", "top_k", "seed", "logprobs")
_FLOAT = (
    "temperature",
    "top_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
)
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
        "prompt_logprobs",
        "detokenize",
        "lora_name",
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
            if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
                raise invalid_arg("sampling parameter 'stop' must be a string or a list of strings")
            values[name] = tuple(s for s in stops if s)
        elif name == "guided_decoding":
            from oceanus.backends.llm.guide import grammar_of

            text = value if isinstance(value, str) else json.dumps(value)
            values["guided"] = grammar_of(text)
        elif name == "logit_bias":
            values[name] = _logit_bias(value)
        elif name in _IGNORED:
            ignored.append(name)
        else:
            raise invalid_arg(f"unknown sampling parameter '{name}'")
    params = SamplingParams(**values, ignored=tuple(ignored))
    _check(params)
    return params


def _logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """{token id: bias}; ids may be strings, as JSON object keys are."""
    if not isinstance(value, dict):
        raise invalid_arg("sampling parameter 'logit_bias' must be an object of token id: bias")
    pairs = []
    for key, bias in value.items():
        token = _number("logit_bias", key, int)
        if token < 0:
            raise invalid_arg(f"sampling parameter 'logit_bias' has a negative token id: {key!r}")
        pairs.append((token, float(_number("logit_bias", bias, float))))
    return tuple(pairs)


def _check(p: SamplingParams) -> None:
    problems: list[str] = []
    if p.max_tokens < 1:
        problems.append(f"max_tokens must be at least 1, got {p.max_tokens}")
    if p.min_tokens < 0 or p.min_tokens > p.max_tokens:
        problems.append(
            f"min_tokens must be between 0 and max_tokens={p.max_tokens}, got {p.min_tokens}"
        )
    if p.temperature < 0:
        problems.append(f"temperature must be non-negative, got {p.temperature}")
    if not 0 < p.top_p <= 1:
        problems.append(f"top_p must be in (0, 1], got {p.top_p}")
    if p.top_k < -1:
        problems.append(f"top_k must be -1 (disable), or at least 1, got {p.top_k}")
    if p.repetition_penalty <= 0:
        problems.append(f"repetition_penalty must be greater than zero, got {p.repetition_penalty}")
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(p, name)
        if not -2 <= value <= 2:
            problems.append(f"{name} must be in [-2, 2], got {value}")
    if any(not -100 <= bias <= 100 for _, bias in p.logit_bias):
        problems.append("logit_bias values must be in [-100, 100]")
    if p.logprobs is not None and p.logprobs < 0:
        problems.append(f"logprobs must be non-negative, got {p.logprobs}")
    if problems:
        raise invalid_arg("invalid sampling parameters: " + "; ".join(problems))


__all__ = ["InferenceServerError", "SamplingParams", "parse_sampling_parameters"]
