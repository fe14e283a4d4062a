"""Embedding models in the same folder form (`backend: "vllm"`, `model.json`), as vLLM serves
them: the model's own config says whether it generates or embeds (`is_embedding_model`), and
pooling follows its sentence-transformers files (`modules.json`, `1_Pooling/config.json`: mean,
CLS, last token or max; a `Normalize` module makes unit vectors).

A request is the vLLM backend's `embedding_request` input: a JSON object with `input` (a string
or token ids) and optionally `pooling_params.dimensions` ([n]: keep the first n dimensions,
renormalized, for models trained that way). The answer is `text_output` holding the vector as a
JSON list, and `num_input_tokens`. Requests that arrive together run as one padded batch.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from oceanus.backends.llm.args import EngineArgs
from oceanus.backends.llm.encoder_io import Answer, deliver, json_input, text_outputs
from oceanus.backends.llm.loading import load_encoder, read_json
from oceanus.core.backend import LoadContext, RequestInstance, RequestJob, RequestsResult
from oceanus.core.errors import InferenceServerError, invalid_arg

log = logging.getLogger("oceanus.backends.llm")

_GENERATIVE_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def is_embedding_model(folder: Path) -> bool:
    """Sentence-transformers files, or an architecture without a language-model head."""
    if (folder / "modules.json").is_file():
        return True
    config = read_json(folder / "config.json") or {}
    architectures = config.get("architectures") or []
    return bool(architectures) and not any(a.endswith(_GENERATIVE_SUFFIXES) for a in architectures)


def pooling_of(folder: Path) -> tuple[str, bool]:
    """(pooling mode, normalize) from the sentence-transformers files. Without them: mean, not
    normalized, for an encoder; the last token, normalized, for a decoder (a generating
    architecture served with vLLM's runner "pooling"), as vLLM pools a decoder."""
    modules = read_json(folder / "modules.json") or []
    mode, normalize = "mean", False
    if not modules and not is_embedding_model(folder):
        return "last", True
    for module in modules:
        kind = str(module.get("type", ""))
        if kind.endswith("Normalize"):
            normalize = True
        if kind.endswith("Pooling"):
            pooling = read_json(folder / str(module.get("path", "1_Pooling")) / "config.json") or {}
            for key, name in (
                ("pooling_mode_cls_token", "cls"),
                ("pooling_mode_lasttoken", "last"),
                ("pooling_mode_max_tokens", "max"),
                ("pooling_mode_mean_tokens", "mean"),
            ):
                if pooling.get(key):
                    mode = name
                    break
    return mode, normalize


def pool(hidden: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """`hidden` [batch, tokens, width], `mask` [batch, tokens] -> [batch, width]."""
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    if mode == "cls":
        return hidden[:, 0]
    if mode == "last":
        last = mask.sum(dim=1) - 1
        return hidden[torch.arange(hidden.shape[0]), last]
    if mode == "max":
        return hidden.masked_fill(weights == 0, float("-inf")).max(dim=1).values
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)


class EmbeddingInstance(RequestInstance):
    def __init__(self, context: LoadContext, args: EngineArgs) -> None:
        config = context.config
        self.name = config.name
        self.tokenizer, model = load_encoder(args, "AutoModel")
        self.model = model
        self.max_len = int(args.max_model_len or model.config.max_position_embeddings)
        self.mode, self.normalize = pooling_of(Path(args.model))
        self.threads = args.num_threads or context.spec.cpu_threads
        log.info(
            "model '%s': embedding model ready (%s pooling%s, %d dimensions)",
            config.name,
            self.mode,
            ", normalized" if self.normalize else "",
            model.config.hidden_size,
        )

    def execute_requests(self, jobs: Sequence[RequestJob]) -> RequestsResult:
        outputs: list[Answer] = []
        parsed: list[tuple[list[int], int | None] | InferenceServerError] = []
        for job in jobs:
            try:
                parsed.append(self._parse(job))
            except InferenceServerError as exc:
                parsed.append(exc)
        good = [p for p in parsed if not isinstance(p, InferenceServerError)]
        vectors = iter(self._embed([ids for ids, _ in good]) if good else [])
        for item in parsed:
            if isinstance(item, InferenceServerError):
                outputs.append(item)
                continue
            ids, dimensions = item
            vector = next(vectors)
            if dimensions is not None:
                vector = vector[:dimensions]
                if self.normalize:
                    vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
            outputs.append(text_outputs(vector.tolist(), len(ids)))
        return deliver(jobs, outputs)

    def _parse(self, job: RequestJob) -> tuple[list[int], int | None]:
        document = json_input(job, "embedding_request", self.name, "embeds")
        given = document.get("input") if isinstance(document, dict) else None
        if isinstance(given, str):
            ids = list(self.tokenizer(given, add_special_tokens=True)["input_ids"])
        elif isinstance(given, list) and given and all(isinstance(t, int) for t in given):
            ids = list(given)
        else:
            raise invalid_arg("embedding_request 'input' must be a string or token ids")
        if len(ids) > self.max_len:
            raise invalid_arg(
                f"This model's maximum context length is {self.max_len} tokens. However, the "
                f"input has {len(ids)} tokens."
            )
        dims = (document.get("pooling_params") or {}).get("dimensions")
        dimensions = int(dims[0]) if isinstance(dims, list) and dims else None
        width = int(self.model.config.hidden_size)
        if dimensions is not None and not 0 < dimensions <= width:
            raise invalid_arg(f"dimensions must be between 1 and {width}, got {dimensions}")
        return ids, dimensions

    def _embed(self, batch: list[list[int]]) -> list[np.ndarray]:
        longest = max(len(ids) for ids in batch)
        pad = int(self.tokenizer.pad_token_id or 0)
        tokens = torch.full((len(batch), longest), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for row, ids in enumerate(batch):
            tokens[row, : len(ids)] = torch.tensor(ids)
            mask[row, : len(ids)] = 1
        if self.threads:
            torch.set_num_threads(self.threads)
        with torch.inference_mode():
            hidden = self.model(input_ids=tokens, attention_mask=mask).last_hidden_state
            pooled = pool(hidden.float(), mask, self.mode)
            if self.normalize:
                pooled = torch.nn.functional.normalize(pooled, dim=-1)
        return list(pooled.numpy())
