"""GGUF files and weight-only int8 (issue 39): model.json's `model` naming a `.gguf` file made
here from the generator's Llama folder (oceanus/examples/gguf_writer.py), its tokenizer and
chat template read from the file and published as a folder for the OpenAI frontend, its weights
dequantized on load; and `quantization: "int8"` keeping the linears int8 in memory."""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

from oceanus.backends.llm import gguf_model
from oceanus.backends.llm.args import EngineArgs, read_engine_args
from oceanus.backends.llm.engine import Engine, StepOutput
from oceanus.backends.llm.quant import Int8Linear, quantize_linears
from oceanus.backends.llm.sampling import SamplingParams
from oceanus.core.errors import InferenceServerError
from oceanus.examples.gguf_writer import write_gguf
from oceanus.examples.llm import CHAT_TEMPLATE, cached_llm, write_llm_model

sys.path.insert(0, str(Path(__file__).parent))
from llm_testlib import PROMPTS


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny model as F32, F16 and Q8_0 GGUF files in one folder."""
    folder = tmp_path_factory.mktemp("gguf")
    return {
        t: write_gguf(cached_llm("tiny"), folder / f"tiny-{t}.gguf", t)
        for t in ("F32", "F16", "Q8_0")
    }


def _args(version: Path, **raw: Any) -> EngineArgs:
    version.mkdir(parents=True, exist_ok=True)
    (version / "model.json").write_text(json.dumps({"dtype": "float32", **raw}))
    return read_engine_args(version, "m")


def _greedy(engine: Engine, prompts: list[list[int]], length: int) -> list[list[int]]:
    tokens: list[list[int]] = [[] for _ in prompts]
    done = threading.Semaphore(0)

    def sink(index: int) -> Any:
        def take(out: StepOutput) -> None:
            tokens[index] += out.token_ids
            if out.finished:
                done.release()

        return take

    for index, ids in enumerate(prompts):
        params = SamplingParams(max_tokens=length, temperature=0.0, ignore_eos=True)
        engine.submit(ids, params, sink(index))
    for _ in prompts:
        assert done.acquire(timeout=60)
    return tokens


@pytest.fixture(scope="module")
def folder_run() -> tuple[list[list[int]], list[list[int]], int]:
    """The original folder's prompts, greedy tokens (16 each, float32) and weight bytes."""
    folder = cached_llm("tiny")
    engine = Engine(EngineArgs(model=folder, tokenizer=folder))
    try:
        prompts = [engine.encode(p) for p in PROMPTS]
        return prompts, _greedy(engine, prompts, 16), engine.weights_bytes
    finally:
        engine.close()


def test_model_json_names_a_gguf_file_relative_to_the_version_folder(
    ggufs: dict[str, Path], tmp_path: Path
) -> None:
    version = ggufs["F32"].parent / "m" / "1"
    args = _args(version, model="../../tiny-F32.gguf")
    assert gguf_model.is_gguf(args.model)
    assert args.tokenizer == gguf_model.tokenizer_dir(args.model)
    with pytest.raises(InferenceServerError, match="no such GGUF file"):
        _args(tmp_path / "1", model="missing.gguf")
    on_openvino = _args(tmp_path / "2", model=str(ggufs["F32"]), engine="openvino")
    assert on_openvino.tokenizer == gguf_model.tokenizer_dir(on_openvino.model)


def test_a_float_gguf_serves_the_folders_greedy_output(
    ggufs: dict[str, Path], folder_run: Any, tmp_path: Path, caplog: Any
) -> None:
    """F32 and F16 files of the model decode in float32 exactly as the folder does, and the
    tokenizer read from the file encodes the prompts as the folder's does."""
    prompts, want, _ = folder_run
    for kind in ("F32", "F16"):
        with caplog.at_level(logging.INFO, logger="oceanus.backends.llm"):
            engine = Engine(_args(tmp_path / kind, model=str(ggufs[kind])))
        try:
            assert [engine.encode(p) for p in PROMPTS] == prompts
            assert _greedy(engine, prompts, 16) == want
        finally:
            engine.close()
        assert f"{kind} x" in caplog.text and "dequantized to float32" in caplog.text
    # The tokenizer folder the engine publishes for the OpenAI frontend.
    saved = gguf_model.tokenizer_dir(ggufs["F32"])
    config = json.loads((saved / "tokenizer_config.json").read_text())
    assert config["chat_template"] == CHAT_TEMPLATE
    assert (saved / "tokenizer.json").is_file()


def test_a_q8_0_gguf_serves_and_agrees_with_the_folder(
    ggufs: dict[str, Path], folder_run: Any, tmp_path: Path
) -> None:
    """Q8_0 rounds each weight to 1/127 of its block's largest: on the tiny model greedy
    output keeps the folder's first tokens, and the next-token choice along the folder's own
    sequences (teacher-forced top-1) agrees almost everywhere. (Once a greedy sequence takes
    another token, the rest differ: position-by-position agreement of free runs says little.)"""
    prompts, want, _ = folder_run
    engine = Engine(_args(tmp_path, model=str(ggufs["Q8_0"])))
    try:
        got = _greedy(engine, prompts, 16)
    finally:
        engine.close()
    assert [g[:4] for g in got] == [w[:4] for w in want]
    import torch

    model = gguf_model.load_model(ggufs["Q8_0"], torch.float32)
    assert _top1_agreement(model, prompts, want) >= 0.95


def _top1_agreement(model: Any, prompts: list[list[int]], want: list[list[int]]) -> float:
    """The share of positions along the folder's greedy sequences where `model`'s argmax is
    the folder model's."""
    import torch
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(cached_llm("tiny"), dtype=torch.float32)
    same = total = 0
    with torch.no_grad():
        for ids, tokens in zip(prompts, want, strict=True):
            sequence = torch.tensor([ids + tokens])
            a = model(sequence).logits[0, len(ids) - 1 :].argmax(-1)
            b = reference(sequence).logits[0, len(ids) - 1 :].argmax(-1)
            same += int((a == b).sum())
            total += a.numel()
    return same / total


def test_int8_quantization_shrinks_the_weights_and_keeps_greedy(
    folder_run: Any, ggufs: dict[str, Path], tmp_path: Path
) -> None:
    """`quantization: "int8"`: every linear but the head is Int8Linear, the weights take fewer
    bytes (the tiny model's embeddings and head, kept in float, are most of it), and greedy
    output keeps the float32 one's first tokens. A Q8_0 GGUF stays int8 the same way."""
    prompts, want, float_bytes = folder_run
    folder = cached_llm("tiny")
    for name, source in (("folder", str(folder)), ("q8", str(ggufs["Q8_0"]))):
        engine = Engine(_args(tmp_path / name, model=source, quantization="int8"))
        try:
            linears = [m for m in engine.model.modules() if isinstance(m, Int8Linear)]
            assert len(linears) == 7 * 2  # q k v o gate up down, two layers
            assert engine.weights_bytes < 0.7 * float_bytes
            got = _greedy(engine, prompts, 16)
        finally:
            engine.close()
        assert [g[:4] for g in got] == [w[:4] for w in want], name
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    quantize_linears(model)
    assert _top1_agreement(model, prompts, want) >= 0.95


@pytest.mark.parametrize("value", ["awq", "fp8", "gptq", "int4"])
def test_other_quantizations_are_refused(value: str, tmp_path: Path) -> None:
    """int4 runs on the openvino engine only (tests/backends/test_llm_openvino_quant.py)."""
    with pytest.raises(InferenceServerError, match="is not supported here"):
        _args(tmp_path, model=str(cached_llm("tiny")), quantization=value, engine="transformers")


@pytest.fixture(scope="module")
def openai_client(
    ggufs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    openai = pytest.importorskip("openai")
    from tests.conftest import ServerProcess

    repository = tmp_path_factory.mktemp("gguf_repo")
    write_llm_model(repository, "folder", engine_args={"max_model_len": 256})
    write_llm_model(
        repository, "gguf", engine_args={"model": str(ggufs["F32"]), "max_model_len": 256}
    )
    process = ServerProcess([repository])
    try:
        process.wait_live()
        yield openai.OpenAI(base_url=f"http://{process.http_url}/v1", api_key="unused")
    finally:
        process.stop()


def test_chat_completions_on_a_gguf_use_the_files_template(openai_client: Any) -> None:
    """The chat template comes from the file: the GGUF model's chat reply and prompt token
    count equal the folder model's."""
    messages = [{"role": "user", "content": "Hello there"}]
    replies = [
        openai_client.chat.completions.create(
            model=name, messages=messages, max_tokens=8, temperature=0
        )
        for name in ("folder", "gguf")
    ]
    folder, gguf = replies
    assert gguf.choices[0].message.content == folder.choices[0].message.content
    assert gguf.usage.prompt_tokens == folder.usage.prompt_tokens
    assert gguf.usage.completion_tokens == 8
