"""model.json's `quantization` on the openvino engine: NNCF compresses the traced model's weights
to int8 (per output channel) or int4 (groups), they stay compressed in the pipeline (the IR's
weight file shrinks), and greedy decoding keeps to the float model's choices; `int4` on the
default engine is refused naming the engine that runs it. A quantized GGUF file keeps its
weights quantized there. Each of these engines also answers a guided choice."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openvino_genai")
pytest.importorskip("nncf")

import torch
from transformers import AutoModelForCausalLM

from oceanus.backends.llm.args import EngineArgs, read_engine_args
from oceanus.backends.llm.gguf_model import tokenizer_dir
from oceanus.backends.llm.openvino_engine import OpenVinoEngine
from oceanus.backends.llm.openvino_export import int4_group
from oceanus.backends.llm.sampling import SamplingParams
from oceanus.core.errors import InferenceServerError
from oceanus.examples.gguf_writer import write_gguf
from oceanus.examples.llm import cached_llm

sys.path.insert(0, str(Path(__file__).parent))
from llm_testlib import PROMPTS


def _greedy(engine: Any, prompt: list[int], length: int) -> list[int]:
    tokens: list[int] = []
    done = threading.Event()

    def sink(out: Any) -> None:
        tokens.extend(out.token_ids)
        if out.finished:
            done.set()

    engine.submit(prompt, SamplingParams(max_tokens=length, temperature=0.0, ignore_eos=True), sink)
    assert done.wait(120)
    return tokens


def _guided_choice(engine: Any) -> str:
    """A choice under guided decoding (the converted tokenizer serves every folder)."""
    guided = json.dumps({"choice": ["red", "green", "blue"]})
    params = SamplingParams(max_tokens=8, temperature=0.0, guided_decoding=guided)
    text: list[str] = []
    done = threading.Event()

    def sink(out: Any) -> None:
        text.append(out.text)
        if out.finished:
            done.set()

    engine.submit(engine.encode(PROMPTS[0]), params, sink)
    assert done.wait(120)
    return "".join(text)


def _top1_agreement(prompts: list[list[int]], outputs: list[list[int]]) -> float:
    """The share of our greedy tokens that are transformers' float32 argmax, teacher-forced."""
    model = AutoModelForCausalLM.from_pretrained(cached_llm("tiny")).eval()
    agree = total = 0
    for ids, ours in zip(prompts, outputs, strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([ids + ours])).logits[0, len(ids) - 1 : -1]
        agree += int((logits.argmax(-1) == torch.tensor(ours)).sum())
        total += len(ours)
    return agree / total


def _decode(
    quantization: str | None, model: Path | None = None
) -> tuple[int, list[list[int]], list[list[int]], Any]:
    """The IR's weight bytes, the prompts, 24 greedy tokens for each, and the engine's args."""
    model = model or cached_llm("tiny")
    tokenizer = tokenizer_dir(model) if model.suffix == ".gguf" else model
    args = EngineArgs(
        model=model, tokenizer=tokenizer, engine="openvino", quantization=quantization
    )
    engine = OpenVinoEngine(args, threads=2)
    try:
        prompts = [engine.encode(p) for p in PROMPTS]
        outputs = [_greedy(engine, ids, 24) for ids in prompts]
        assert _guided_choice(engine) in ("red", "green", "blue")
        return engine.weights_bytes, prompts, outputs, engine.args
    finally:
        engine.close()


def test_int8_and_int4_weights_stay_compressed_and_decode_like_the_float_model() -> None:
    plain, prompts, float_tokens, _ = _decode(None)
    int8, _, int8_tokens, _ = _decode("int8")
    int4, _, int4_tokens, _ = _decode("int4")
    assert int8 < plain * 0.3  # a quarter of float32's bytes, plus scales
    assert int4 < int8  # the tiny model's embedding and head stay int8 (NNCF's rule for int4)
    assert _top1_agreement(prompts, float_tokens) == 1.0
    # A random-weight model's logits lie close together: rounding moves some argmaxes (measured
    # here 0.97 for int8 and 0.90 for int4 over 96 tokens).
    assert _top1_agreement(prompts, int8_tokens) >= 0.9
    assert _top1_agreement(prompts, int4_tokens) >= 0.75


@pytest.mark.parametrize(("tensor_type", "kept"), [("Q8_0", "int8"), ("Q4_0", "int4")])
def test_a_quantized_gguf_stays_quantized_on_the_openvino_engine(
    tensor_type: str, kept: str, tmp_path: Path
) -> None:
    """A Q8_0 / Q4_0 GGUF file (tokenizer from the file) is dequantized, traced and its weights
    compressed back to int8 / int4: about the file's size, not float32's."""
    path = write_gguf(cached_llm("tiny"), tmp_path / f"tiny-{tensor_type}.gguf", tensor_type)
    weights, prompts, outputs, args = _decode(None, path)
    assert args.quantization == kept
    plain, folder_prompts, *_ = _decode(None)
    assert weights < plain * 0.3
    assert prompts == folder_prompts  # the file's tokenizer encodes as the folder's
    assert _top1_agreement(prompts, outputs) >= (0.9 if kept == "int8" else 0.6)


def test_int4_group_divides_every_input_width() -> None:
    llama = {"hidden_size": 768, "intermediate_size": 2816, "num_attention_heads": 12}
    assert int4_group(llama) == 128
    tiny = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4}
    assert int4_group(tiny) == 64
    assert int4_group({**llama, "hidden_size": 100, "num_attention_heads": 4}) == -1


def _args(version: Path, **raw: Any) -> EngineArgs:
    version.mkdir(parents=True, exist_ok=True)
    model = str(cached_llm("tiny"))
    (version / "model.json").write_text(json.dumps({"model": model, **raw}))
    return read_engine_args(version, "m")


def test_int4_runs_on_the_openvino_engine_only(tmp_path: Path) -> None:
    assert _args(tmp_path / "a", engine="openvino", quantization="int4").quantization == "int4"
    assert _args(tmp_path / "b", quantization="int8").quantization == "int8"
    with pytest.raises(InferenceServerError, match="'int4' runs on engine \"openvino\""):
        _args(tmp_path / "c", engine="transformers", quantization="int4")
    # engine "auto" (the default) runs a Llama-family model's int4 on the openvino engine
    assert _args(tmp_path / "e", quantization="int4").engine == "openvino"
    with pytest.raises(InferenceServerError, match="need its CUDA kernels"):
        _args(tmp_path / "d", engine="openvino", quantization="awq")
