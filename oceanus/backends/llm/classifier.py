"""Cross-encoders (`*ForSequenceClassification` folders, BERT / XLM-R style rerankers) in the
vLLM folder form, as vLLM serves them for `/score` and `/rerank`: each (query, document) pair is
tokenized as one sequence (the tokenizer's pair template: `[CLS] a [SEP] b [SEP]` and token
types) and scored by the classification head in one batched pass.

The score is the head's output through vLLM's activation (vllm/model_executor/layers/pooler/
activations.py `get_act_fn`): the config's `problem_type` (`regression`: none), else the
sentence-transformers `activation_fn` (a `torch.nn.modules` class), else sigmoid for one
label. A model with several labels cannot score (vLLM refuses it too).

Its config gets one more input, `score_request` (backend.py completes it), which the OpenAI
frontend looks for to score with it: a JSON `{"pairs": [[a, b], ...]}`. The answer is
`text_output`, the scores as a JSON list, and `num_input_tokens`, all pairs'."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from oceanus.backends.llm.args import EngineArgs
from oceanus.backends.llm.encoder_io import Answer, deliver, json_input, text_outputs
from oceanus.backends.llm.loading import load_encoder, read_json
from oceanus.core.backend import LoadContext, RequestInstance, RequestJob, RequestsResult
from oceanus.core.errors import InferenceServerError, invalid_arg

log = logging.getLogger("oceanus.backends.llm")

SCORE_INPUT = "score_request"

# The activations vLLM allows by name (it loads only torch.nn.modules classes).
_ACTIVATIONS = {"Sigmoid": torch.sigmoid, "Identity": lambda x: x, "Tanh": torch.tanh}


def is_classifier(folder: Path) -> bool:
    config = read_json(folder / "config.json") or {}
    return any(
        str(a).endswith("ForSequenceClassification") for a in config.get("architectures") or []
    )


def activation(config: Any) -> Any:
    """vLLM's choice of the score's activation for a one-label head."""
    if getattr(config, "problem_type", None) == "regression":
        return _ACTIVATIONS["Identity"]
    name = (getattr(config, "sentence_transformers", None) or {}).get("activation_fn") or getattr(
        config, "sbert_ce_default_activation_function", None
    )
    if name:
        if not str(name).startswith("torch.nn.modules.") or name.split(".")[-1] not in _ACTIVATIONS:
            raise invalid_arg(f"unsupported cross-encoder activation_fn {name!r}")
        return _ACTIVATIONS[name.split(".")[-1]]
    return torch.sigmoid


class ClassifierInstance(RequestInstance):
    def __init__(self, context: LoadContext, args: EngineArgs) -> None:
        config = context.config
        self.name = config.name
        self.tokenizer, model = load_encoder(args, "AutoModelForSequenceClassification")
        self.model = model
        self.labels = int(model.config.num_labels)
        self.activation = activation(model.config)
        self.max_len = int(args.max_model_len or model.config.max_position_embeddings)
        self.threads = args.num_threads or context.spec.cpu_threads
        log.info(
            "model '%s': cross-encoder ready (%s, %d label%s)",
            config.name,
            model.config.architectures[0],
            self.labels,
            "" if self.labels == 1 else "s",
        )

    def execute_requests(self, jobs: Sequence[RequestJob]) -> RequestsResult:
        answers: list[Answer] = []
        for job in jobs:
            try:
                answers.append(self._answer(job))
            except InferenceServerError as exc:
                answers.append(exc)
        return deliver(jobs, answers)

    def _answer(self, job: RequestJob) -> dict[str, np.ndarray]:
        pairs = self._parse(job)
        if self.labels != 1:
            raise invalid_arg(
                f"model '{self.name}' has {self.labels} labels: scoring needs a cross-encoder "
                "with one label"
            )
        scores, tokens = self.score(pairs)
        return text_outputs(scores, tokens)

    def _parse(self, job: RequestJob) -> list[tuple[str, str]]:
        document = json_input(job, SCORE_INPUT, self.name, "scores pairs")
        pairs = document.get("pairs") if isinstance(document, dict) else None
        if not (
            isinstance(pairs, list)
            and pairs
            and all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(t, str) for t in p)
                for p in pairs
            )
        ):
            raise invalid_arg(
                f"model '{self.name}' is a cross-encoder: {SCORE_INPUT} must be "
                '{"pairs": [[text, text], ...]}'
            )
        return [(a, b) for a, b in pairs]

    def score(self, pairs: list[tuple[str, str]]) -> tuple[list[float], int]:
        """Every pair's score in one padded batch, and the tokens they took."""
        encoded = self.tokenizer(
            [a for a, _ in pairs], [b for _, b in pairs], padding=True, return_tensors="pt"
        )
        lengths = encoded["attention_mask"].sum(-1)
        longest = int(lengths.max())
        if longest > self.max_len:
            raise invalid_arg(
                f"This model's maximum context length is {self.max_len} tokens. However, a "
                f"query and document pair has {longest} tokens."
            )
        if self.threads:
            torch.set_num_threads(self.threads)
        with torch.inference_mode():
            logits = self.model(**encoded).logits.float()
            scores = self.activation(logits[:, 0])
        return [float(s) for s in scores], int(lengths.sum())
