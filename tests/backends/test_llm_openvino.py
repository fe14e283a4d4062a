"""model.json's `engine: "openvino"`: OpenVINO GenAI's continuous-batching pipeline in its own
process, on the decoder we trace (openvino_export.py). In process: greedy output equals
transformers' `generate` token for token for a burst prefilled in chunks; stop strings, EOS,
cancellation and what the engine refuses; the worker's death fails its requests and later
ones clearly. Through the server: both engines side by side answer the same greedy text."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("openvino_genai")

import torch
from transformers import AutoModelForCausalLM

from oceanus.backends.llm.args import EngineArgs
from oceanus.backends.llm.openvino_engine import OpenVinoEngine
from oceanus.backends.llm.sampling import SamplingParams
from oceanus.backends.llm.scheduler import StepOutput
from oceanus.core.errors import ErrorCode, InferenceServerError
from oceanus.examples.llm import cached_llm, write_llm_model

sys.path.insert(0, str(Path(__file__).parent))
from llm_testlib import PROMPTS, Collect, worst_margin_in_ulps


@pytest.fixture(scope="module")
def engine() -> Any:
    folder = cached_llm("tiny")
    # An 8-token prefill budget: the longer prompts prefill over several steps.
    args = EngineArgs(model=folder, tokenizer=folder, engine="openvino", max_num_batched_tokens=8)
    engine = OpenVinoEngine(args, threads=2)
    yield engine
    engine.close()


def greedy(max_tokens: int, **more: Any) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, **more)


def hf_greedy(prompt: list[int], length: int) -> tuple[list[int], float]:
    """transformers' tokens, and the sum of their log probabilities."""
    model = AutoModelForCausalLM.from_pretrained(cached_llm("tiny")).eval()
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=length,
            min_new_tokens=length,
            do_sample=False,
            output_logits=True,  # unprocessed (min_new_tokens masks EOS in the scores)
            return_dict_in_generate=True,
        )
    tokens = out.sequences[0, len(prompt) :].tolist()
    total = sum(
        float(torch.log_softmax(score[0], -1)[token])
        for score, token in zip(out.logits, tokens, strict=True)
    )
    return tokens, total


def test_a_burst_in_chunks_equals_transformers_generate(engine: Any) -> None:
    lengths = [24, 9, 17, 12]
    prompts = [engine.encode(p) for p in PROMPTS]
    sinks = [Collect() for _ in PROMPTS]
    with engine._cond:  # hold the step loop: all four arrive together
        for ids, length, sink in zip(prompts, lengths, sinks, strict=True):
            engine.submit(ids, greedy(length, ignore_eos=True), sink)
    for ids, length, sink in zip(prompts, lengths, sinks, strict=True):
        last = sink.wait()[-1]
        expected, logprob = hf_greedy(ids, length)
        assert sink.tokens == expected
        assert (last.finish_reason, last.num_output_tokens) == ("length", length)
        assert last.cumulative_logprob == pytest.approx(logprob, abs=1e-3)
    assert engine.counters.running == 0 and engine.counters.reserved_tokens == 0


def test_bfloat16_decodes_within_two_ulps_of_transformers_in_bfloat16() -> None:
    """model.json `dtype: "bfloat16"`: the CPU plugin's bf16 inference precision and KV cache;
    greedy tokens may part from transformers' where two logits lie within bf16's rounding, and
    each stays within 2 bf16 ulps of transformers' best (as the default engine's do)."""
    folder = cached_llm("tiny")
    args = EngineArgs(model=folder, tokenizer=folder, engine="openvino", dtype="bfloat16")
    engine = OpenVinoEngine(args, threads=2)
    try:
        prompts = [engine.encode(p) for p in PROMPTS]
        sinks = [Collect() for _ in PROMPTS]
        for ids, sink in zip(prompts, sinks, strict=True):
            engine.submit(ids, greedy(24, ignore_eos=True), sink)
        tokens = [sink.tokens if sink.wait() else [] for sink in sinks]
    finally:
        engine.close()
    assert [len(t) for t in tokens] == [24] * len(PROMPTS)
    assert worst_margin_in_ulps(prompts, tokens, torch.bfloat16) <= 2.0


def test_stop_strings_and_eos_end_it_here_and_there(engine: Any) -> None:
    prompt = engine.encode(PROMPTS[0])
    whole = Collect()
    engine.submit(prompt, greedy(30, ignore_eos=True), whole)
    text = "".join(out.text for out in whole.wait())
    stop = text[10:14]
    cut = Collect()
    engine.submit(prompt, greedy(30, ignore_eos=True, stop=(stop,)), cut)
    outputs = cut.wait()
    assert outputs[-1].finish_reason == "stop"
    assert "".join(out.text for out in outputs) == text[: text.find(stop)]
    # The model's EOS is made the third greedy token's: the request stops there.
    third = whole.tokens[2]
    saved, engine.eos = engine.eos, third
    try:
        eos = Collect()
        engine.submit(prompt, greedy(30), eos)
        outputs = eos.wait()
    finally:
        engine.eos = saved
    assert outputs[-1].finish_reason == "stop" and outputs[-1].num_output_tokens == 3
    assert engine.counters.running == 0


def test_a_cancelled_request_leaves_at_the_next_step(engine: Any) -> None:
    gone = threading.Event()
    sink = Collect()

    def cancel_after_the_first(out: StepOutput) -> None:
        sink(out)
        gone.set()

    engine.submit(
        engine.encode(PROMPTS[1]), greedy(500, ignore_eos=True), cancel_after_the_first, gone.is_set
    )
    outputs = sink.wait()
    assert outputs[-1].finish_reason == "abort"
    assert outputs[-1].error is not None and outputs[-1].error.code == ErrorCode.CANCELLED
    assert outputs[-1].num_output_tokens < 20
    assert engine.counters.running == 0


@pytest.mark.parametrize(
    ("params", "words"),
    [
        (
            greedy(4, guided_decoding='{"grammar": "start: \\"a\\""}'),
            "Lark grammar .* is not supported by engine 'openvino'",
        ),
        (greedy(4, logprobs=3), "chosen token's log probability only"),
        (greedy(4, logit_bias=((5, 1.0),)), "logit_bias is not supported"),
    ],
)
def test_what_the_pipeline_cannot_do_is_refused(
    engine: Any, params: SamplingParams, words: str
) -> None:
    with pytest.raises(InferenceServerError, match=words) as caught:
        engine.submit(engine.encode("x"), params, Collect())
    assert caught.value.code == ErrorCode.INVALID_ARG


def test_logprobs_of_the_chosen_token(engine: Any) -> None:
    sink = Collect()
    engine.submit(engine.encode(PROMPTS[2]), greedy(5, logprobs=1, ignore_eos=True), sink)
    outputs = sink.wait()
    chosen = [(t, lp) for out in outputs for top in out.logprobs or [] for t, lp in top.items()]
    assert [t for t, _ in chosen] == sink.tokens
    assert sum(lp for _, lp in chosen) == pytest.approx(outputs[-1].cumulative_logprob)


def test_a_model_of_another_architecture_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "gpt2ish"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    args = EngineArgs(model=folder, tokenizer=folder, engine="openvino")
    with pytest.raises(InferenceServerError, match="model_type 'gpt2': use engine 'transformers'"):
        OpenVinoEngine(args)


def test_the_worker_dying_fails_its_requests_and_later_ones() -> None:
    folder = cached_llm("tiny")
    engine = OpenVinoEngine(EngineArgs(model=folder, tokenizer=folder, engine="openvino"))
    try:
        running = Collect()
        first = threading.Event()

        def on_token(out: StepOutput) -> None:
            running(out)
            first.set()

        engine.submit(engine.encode(PROMPTS[0]), greedy(100_000, ignore_eos=True), on_token)
        assert first.wait(60)
        os.kill(engine._process.pid, signal.SIGKILL)
        last = running.wait()[-1]
        assert last.error is not None and "openvino engine process is gone" in last.error.message
        with pytest.raises(InferenceServerError, match="openvino engine process is gone"):
            engine.submit(engine.encode("x"), greedy(3), Collect())
    finally:
        engine.close()


def test_both_engines_in_one_server_answer_alike(tmp_path: Path, launch: Any) -> None:
    """The same folder under both engines (engine "auto" picks openvino for it), each
    request's greedy text equal."""
    write_llm_model(tmp_path, "llm_tiny")
    write_llm_model(tmp_path, "llm_ov", engine_args={"engine": "auto"})  # the default: openvino
    server = launch([tmp_path])

    def generate(model: str, prompt: str) -> dict[str, Any]:
        body = {"text_input": prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": True}
        request = urllib.request.Request(
            f"http://{server.http_url}/v2/models/{model}/generate",
            data=json.dumps(body).encode(),
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            return dict(json.loads(response.read()))

    for prompt in PROMPTS:
        assert (
            generate("llm_ov", prompt)["text_output"] == generate("llm_tiny", prompt)["text_output"]
        )
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/llm_ov/config") as response:
        assert json.loads(response.read())["model_transaction_policy"]["decoupled"] is True
    # What the engine refuses at its first step is a 400 before a stream's head (was: a 200
    # whose one event was the error), as vLLM's server answers it.
    body = {"model": "llm_ov", "messages": [{"role": "user", "content": "x"}], "stream": True}
    body |= {"max_tokens": 2, "logprobs": True, "top_logprobs": 2}
    request = urllib.request.Request(
        f"http://{server.http_url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=60)
    assert caught.value.code == 400
    assert "engine 'openvino'" in json.loads(caught.value.read())["error"]["message"]


def test_without_openvino_genai_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openvino_genai", None)  # as if not installed
    folder = cached_llm("tiny")
    with pytest.raises(InferenceServerError, match=r"oceanus\[llm\]") as caught:
        OpenVinoEngine(EngineArgs(model=folder, tokenizer=folder, engine="openvino"))
    assert caught.value.code == ErrorCode.UNAVAILABLE
