"""model.json's `engine: "auto"` (its default): the openvino engine for a Llama-family causal LM
where openvino-genai is installed, the transformers engine for everything it cannot serve, and
the reason in the load log (engine_choice.py), and transformers where the openvino engine's
first load (a float32 trace) would not fit the memory. Read from real model.json files."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

from oceanus.backends.llm.args import read_engine_args
from oceanus.backends.llm.engine_choice import parameter_count
from oceanus.core.errors import InferenceServerError
from oceanus.examples.llm import cached_llm


def _read(tmp_path: Path, **raw: Any) -> tuple[str, str]:
    version = tmp_path / "1"
    version.mkdir(exist_ok=True)
    (version / "model.json").write_text(json.dumps({"model": str(cached_llm("tiny")), **raw}))
    args = read_engine_args(version, "m")
    return args.engine, args.engine_source


def test_a_llama_model_runs_on_openvino_by_default(tmp_path: Path) -> None:
    pytest.importorskip("openvino_genai")
    engine, why = _read(tmp_path)
    assert engine == "openvino" and why.startswith("auto: a llama causal LM")
    assert _read(tmp_path, engine="auto")[0] == "openvino"


def test_what_openvino_cannot_serve_stays_on_transformers(tmp_path: Path) -> None:
    assert _read(tmp_path, enable_lora=True) == (
        "transformers",
        "auto: LoRA adapters run on the transformers engine",
    )
    assert _read(tmp_path, runner="pooling") == ("transformers", "auto: served for pooling")
    assert _read(tmp_path, engine="transformers") == ("transformers", "model.json")


def test_an_architecture_the_exporter_does_not_trace(tmp_path: Path) -> None:
    folder = tmp_path / "gpt2ish"
    folder.mkdir()
    config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}
    (folder / "config.json").write_text(json.dumps(config))
    version = tmp_path / "1"
    version.mkdir()
    (version / "model.json").write_text(json.dumps({"model": str(folder)}))
    args = read_engine_args(version, "m")
    assert args.engine == "transformers"
    assert args.engine_source == "auto: the openvino engine does not trace model_type 'gpt2'"


def test_without_the_packages_auto_says_which_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("openvino_genai")
    monkeypatch.setitem(sys.modules, "nncf", None)  # as if not installed
    engine, why = _read(tmp_path, quantization="int8")
    assert engine == "transformers" and "oceanus[llm-openvino]" in why
    monkeypatch.setitem(sys.modules, "openvino_genai", None)
    engine, why = _read(tmp_path)
    assert engine == "transformers" and "oceanus[llm]" in why


def test_an_unknown_engine_names_the_choices(tmp_path: Path) -> None:
    with pytest.raises(InferenceServerError, match="auto, transformers, openvino, got 'onnx'"):
        _read(tmp_path, engine="onnx")


def test_a_trace_that_would_not_fit_stays_on_transformers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The openvino engine's first load traces in float32 (~2.5x those bytes at its peak):
    on a machine without that memory, "auto" keeps an untraced model on transformers; a model
    already traced (cached) has nothing to trace and runs on openvino."""
    pytest.importorskip("openvino_genai")
    from oceanus.backends.llm import memory
    from oceanus.backends.llm.openvino_export import cached_ir

    cached_ir(cached_llm("tiny"))  # traced: in the cache
    copy = tmp_path / "copy"
    shutil.copytree(cached_llm("tiny"), copy)  # another folder: not traced yet
    monkeypatch.setattr(memory, "available_bytes", lambda: 2**20)
    version = tmp_path / "1"
    version.mkdir()
    (version / "model.json").write_text(json.dumps({"model": str(copy)}))
    args = read_engine_args(version, "m")
    assert args.engine == "transformers"
    assert "tracing it for the openvino engine (its first load) needs about" in args.engine_source
    assert "1 MiB is available" in args.engine_source
    assert _read(tmp_path)[0] == "openvino"


def test_the_parameter_count_is_the_models() -> None:
    """What the memory estimate counts equals the model's own parameters, norms aside."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = cached_llm("tiny")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    weights = sum(p.numel() for n, p in model.named_parameters() if "norm" not in n)
    assert parameter_count(json.loads((folder / "config.json").read_text())) == weights
