"""The version folders of the example repository's language and embedding models: `model.json`
as Triton's vLLM backend reads it, naming a Hugging Face folder made here (examples/llm.py,
examples/embedder.py). Needs the `llm` extra."""

from __future__ import annotations

import json
import pathlib

from oceanus.examples.embedder import write_hf_embedder
from oceanus.examples.llm import cached_llm


def write_llm_version(version: pathlib.Path) -> None:
    """`1/model.json` for the tiny chat model (generated once into the examples' cache)."""
    args = {"model": str(cached_llm("tiny")), "max_model_len": 1024, "seed": 0}
    (version / "model.json").write_text(json.dumps(args, indent=2) + "\n")


def write_embedder_version(version: pathlib.Path) -> None:
    """`1/model.json` naming the embedder's folder beside it (`<model>/hf`)."""
    write_hf_embedder(version.parent / "hf")
    (version / "model.json").write_text(json.dumps({"model": "../hf"}, indent=2) + "\n")
