"""transformers sets torch's process-wide default dtype while it builds a model, and a server
loads its models in parallel: every transformers load of the LLM backend (the engine's and the
embedder's) goes through one lock (`loading.LOADING`). Without it a bfloat16 engine loading beside
the float32 embedder got float32 norms, and the README's chat answered 500 in 2 of 3 full runs.
The race is order-dependent, so this pins the rule itself: the embedder's load (loading.py's
`load_encoder`, the cross-encoder's too) waits while an engine's build holds the lock, then
builds in its own dtype."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from oceanus.backends.llm import embedder, loading
from oceanus.backends.llm.args import read_engine_args
from oceanus.core.backend import InstanceSpec, LoadContext, ModelFiles
from oceanus.core.repository import model_config
from oceanus.examples.embedder import write_embedding_model


class ObservedLock:
    """The backend's lock, telling the test when a load has reached it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reached = threading.Event()

    def __enter__(self) -> ObservedLock:
        self.reached.set()
        self.lock.acquire()
        return self

    def __exit__(self, *_: object) -> None:
        self.lock.release()


def _load_embedder(folder: Path) -> Any:
    config = model_config.read_config_file(folder / "config.pbtxt")
    model_config.normalize(config)
    files = ModelFiles(folder, folder / "1", folder / "1" / "model.json")
    context = LoadContext(config, files, InstanceSpec("e_0", "CPU", 0, 1))
    return embedder.EmbeddingInstance(context, read_engine_args(folder / "1", config.name))


def test_the_embedders_load_waits_for_an_engines_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = write_embedding_model(tmp_path)
    lock = ObservedLock()
    monkeypatch.setattr(loading, "LOADING", lock)
    loaded: list[Any] = []
    failed: list[BaseException] = []

    def load() -> None:
        try:
            loaded.append(_load_embedder(folder))
        except BaseException as exc:  # reported by the test below
            failed.append(exc)

    thread = threading.Thread(target=load)
    previous = torch.get_default_dtype()
    with lock.lock:  # an engine's bfloat16 build in progress
        torch.set_default_dtype(torch.bfloat16)
        try:
            thread.start()
            assert lock.reached.wait(120), "the embedder's load never reached the shared lock"
            assert not loaded and not failed  # it waits for the build to end
        finally:
            torch.set_default_dtype(previous)
    thread.join(120)
    assert not failed, failed
    dtypes = {p.dtype for p in loaded[0].model.parameters()}
    assert dtypes == {torch.float32}
