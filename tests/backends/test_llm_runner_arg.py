"""model.json's `runner` (vLLM's --runner) and its older `task`: "pooling" / "embed" serve a
generating model as an embedding model; a value vLLM would not take is refused at load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oceanus.backends.llm.args import read_engine_args
from oceanus.core.errors import InferenceServerError


def _runner(tmp_path: Path, **keys: str) -> str:
    (tmp_path / "model.json").write_text(json.dumps({"model": str(tmp_path), **keys}))
    return read_engine_args(tmp_path, "m").runner


def test_runner_and_task(tmp_path: Path) -> None:
    assert _runner(tmp_path) == "auto"
    assert _runner(tmp_path, runner="pooling") == "pooling"
    assert _runner(tmp_path, task="embed") == "pooling"
    assert _runner(tmp_path, task="generate") == "generate"
    for wrong in ({"runner": "draft"}, {"task": "transcription"}):
        with pytest.raises(InferenceServerError):
            _runner(tmp_path, **wrong)
    with pytest.raises(InferenceServerError) as caught:
        _runner(tmp_path, runner="generate", task="embed")
    assert "needs runner 'pooling'" in caught.value.message
