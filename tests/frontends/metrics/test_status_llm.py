"""The status document's figures for a language model (tokens/s, time to first token, time per
output token: issue 25), in process: the real core with the LLM backend and the tiny generated
model, a streamed generation through `ServerCore.infer_stream`, then the document the page
polls. The page's drawing of them is checked in a browser in test_status_page.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from oceanus.backends import builtin
from oceanus.core.observability.custom_metrics import GAUGE, CustomMetricRegistry
from oceanus.core.server import CoreOptions, ServerCore
from oceanus.core.types import InferRequest, Tensor
from oceanus.examples.llm import write_llm_model
from oceanus.frontends.metrics.status import StatusSource, language_models

MAX_TOKENS = 6


def generate_request(prompt: str) -> InferRequest:
    def text(name: str, value: str) -> Tensor:
        return Tensor(name, "BYTES", (1,), np.array([value.encode()], dtype=np.object_))

    params = {"max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    return InferRequest(
        "llm_tiny",
        inputs=[
            text("text_input", prompt),
            Tensor("stream", "BOOL", (1,), np.array([True])),
            text("sampling_parameters", json.dumps(params)),
        ],
    )


def llm_entry(document: dict[str, Any]) -> dict[str, Any]:
    return next(m for m in document["models"] if m["name"] == "llm_tiny")


def test_document_shows_tokens_and_token_times_of_a_language_model(tmp_path: Path) -> None:
    write_llm_model(tmp_path, "llm_tiny")

    async def main() -> None:
        core = ServerCore(
            CoreOptions(repositories=[tmp_path], backends=builtin.registry(entry_points=False))
        )
        await core.start()
        try:
            source = StatusSource(core, "test", None, lambda: {})
            before = llm_entry(source.document())["stats"]["llm"]
            assert before["generation_tokens"] == 0 and before["ttft"]["count"] == 0
            for prompt in ("The ocean covers", "Tides rise and fall"):
                responses = [r async for r in core.infer_stream(generate_request(prompt))]
                assert responses
            figures = llm_entry(source.document())["stats"]["llm"]
        finally:
            await core.shutdown()
        assert figures["generation_tokens"] == 2 * MAX_TOKENS
        assert figures["prompt_tokens"] > 0
        # one first token per request, one gap per later token; every time is above zero
        assert figures["ttft"]["count"] == 2 and figures["ttft"]["sum_s"] > 0
        assert figures["tpot"]["count"] == 2 * (MAX_TOKENS - 1) and figures["tpot"]["sum_s"] > 0
        assert figures["running"] == 0 and figures["waiting"] == 0
        assert figures["kv_cache_usage"] == 0

    asyncio.run(main())


def test_only_the_vllm_families_count_as_language_model_figures() -> None:
    registry = CustomMetricRegistry()
    owner = registry.owner()
    owner.new_family(1, "my_gauge", "not an LLM figure", GAUGE)
    owner.new_metric(2, 1, {"model": "m", "version": "1"}, None)
    owner.new_family(3, "vllm:num_requests_running", "running", GAUGE)
    owner.new_metric(4, 3, {"model": "llm", "version": "1"}, None)
    owner.update(4, "set", 3)
    assert language_models(registry) == {("llm", "1"): {"running": 3}}
