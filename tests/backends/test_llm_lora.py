"""LoRA adapters on the CPU engine, in process: three adapters made with peft (different
ranks and targets, rslora on one) and the base model in one batch of 16 sequences, every greedy
output equal to transformers + peft's `generate` on the same adapter (float32)."""

from __future__ import annotations

import json
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("peft")

from oceanus.backends.llm.args import EngineArgs
from oceanus.backends.llm.engine import Engine, StepOutput
from oceanus.backends.llm.sampling import SamplingParams
from oceanus.core.errors import ErrorCode, InferenceServerError
from oceanus.examples.llm import cached_llm

sys.path.insert(0, str(Path(__file__).parent))
from llm_testlib import PROMPTS
from lora_testlib import ADAPTERS, make_adapters, peft_greedy

LENGTH = 10


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_adapters(tmp_path_factory.mktemp("lora"))


@pytest.fixture(scope="module")
def expected(adapters: dict[str, Path]) -> dict[tuple[str | None, int], list[int]]:
    """(adapter or None, prompt index) -> transformers + peft's greedy tokens."""
    engine = Engine(_args(adapters))
    prompts = [engine.encode(p) for p in PROMPTS]
    engine.close()
    return {
        (name, index): peft_greedy(adapters[name] if name else None, prompt, LENGTH)
        for name in [None, *ADAPTERS]
        for index, prompt in enumerate(prompts)
    }


def _args(adapters: dict[str, Path], **extra: Any) -> EngineArgs:
    folder = cached_llm("tiny")
    settings: dict[str, Any] = {
        "enable_lora": True,
        "max_loras": 3,
        "lora_modules": tuple(adapters.items()),
        **extra,
    }
    return EngineArgs(model=folder, tokenizer=folder, **settings)


def _run(engine: Engine, jobs: list[tuple[str | None, int]]) -> list[list[int]]:
    """Submit every job before the engine's first step; each one's greedy tokens."""
    tokens: list[list[int]] = [[] for _ in jobs]
    done = threading.Semaphore(0)
    params = SamplingParams(max_tokens=LENGTH, temperature=0.0, ignore_eos=True)

    def sink(index: int) -> Any:
        def take(out: StepOutput) -> None:
            assert out.error is None, out.error
            tokens[index] += out.token_ids
            if out.finished:
                done.release()

        return take

    with engine._cond:  # hold the step loop so that all arrive at once
        for index, (name, prompt) in enumerate(jobs):
            engine.submit(engine.encode(PROMPTS[prompt]), params, sink(index), lora_name=name)
    for _ in jobs:
        assert done.acquire(timeout=120)
    return tokens


JOBS = [(name, index) for index in range(len(PROMPTS)) for name in [None, *ADAPTERS]]


def test_three_adapters_and_the_base_in_one_batch_equal_peft(
    adapters: dict[str, Path], expected: dict[tuple[str | None, int], list[int]]
) -> None:
    engine = Engine(_args(adapters))
    assert engine.fused_mlps  # the "mlp" adapter's rows take the unfused path beside them
    steps: list[int] = []
    engine.on_step = lambda e: steps.append(len(e._running))
    try:
        tokens = _run(engine, JOBS)
    finally:
        engine.close()
    assert len(JOBS) == 16 and max(steps) == 16  # all 16 ran in the same passes
    for job, got in zip(JOBS, tokens, strict=True):
        assert got == expected[job], job
    # The adapters do change the output (else the check above proves nothing).
    for index in range(len(PROMPTS)):
        outputs = {tuple(expected[(name, index)]) for name in [None, *ADAPTERS]}
        assert len(outputs) == 4


def test_max_loras_one_runs_one_adapter_at_a_time_and_keeps_kv_apart(
    adapters: dict[str, Path], expected: dict[tuple[str | None, int], list[int]]
) -> None:
    """max_loras 1: sequences of other adapters wait while one adapter runs; the long prompts'
    full blocks left in the prefix cache by the base and each adapter are never reused by
    another (same tokens, different KV)."""
    engine = Engine(_args(adapters, max_loras=1))
    running: list[set[int]] = []
    engine.on_step = lambda e: running.append({s.lora_id for s in e._running if s.lora_id})
    try:
        tokens = _run(engine, JOBS)
        assert engine.counters.prefix_cache_hits == 0
        again = _run(engine, JOBS[12:])  # the long prompt again, each its own: cache hits
        assert engine.counters.prefix_cache_hits > 0
    finally:
        engine.close()
    assert max(len(ids) for ids in running) == 1
    for job, got in zip(JOBS, tokens, strict=True):
        assert got == expected[job], job
    for job, got in zip(JOBS[12:], again, strict=True):
        assert got == expected[job], job


def test_a_rank_above_max_lora_rank_is_refused_at_load(adapters: dict[str, Path]) -> None:
    with pytest.raises(InferenceServerError, match="rank 16 is greater than max_lora_rank 8"):
        Engine(_args(adapters, max_lora_rank=8))


def test_unloading_an_adapter_in_use_lets_its_streams_finish(
    adapters: dict[str, Path], expected: dict[tuple[str | None, int], list[int]]
) -> None:
    """Unload while a sequence uses the adapter: it finishes with the adapter's output, new
    requests for it are refused (NOT_FOUND), and a reload under the same name works."""
    engine = Engine(_args(adapters))
    assert engine.adapters is not None
    done = threading.Event()
    tokens: list[int] = []
    unloaded = threading.Event()

    def sink(out: StepOutput) -> None:
        assert out.error is None, out.error
        tokens.extend(out.token_ids)
        if len(tokens) == 3:
            engine.adapters.unload("all")  # type: ignore[union-attr]
            unloaded.set()
        if out.finished:
            done.set()

    params = SamplingParams(max_tokens=LENGTH, temperature=0.0, ignore_eos=True)
    old = engine.adapters.by_name["all"].id
    try:
        engine.submit(engine.encode(PROMPTS[0]), params, sink, lora_name="all")
        assert done.wait(60) and unloaded.is_set()
        assert tokens == expected[("all", 0)]
        with pytest.raises(InferenceServerError) as refused:
            engine.submit(engine.encode(PROMPTS[0]), params, sink, lora_name="all")
        assert refused.value.code is ErrorCode.NOT_FOUND
        # Its weights left every linear once its last sequence ended.
        assert all(old not in lin.weights for lin in engine.adapters.linears.values())
        engine.adapters.load("all", adapters["all"])
        assert _run(engine, [("all", 1)]) == [expected[("all", 1)]]
    finally:
        engine.close()


def _read(tmp_path: Path, keys: dict[str, Any], multi: dict[str, str] | None = None) -> Any:
    from oceanus.backends.llm.args import read_engine_args

    version = tmp_path / "1"
    version.mkdir(exist_ok=True)
    (version / "model.json").write_text(json.dumps({"model": str(cached_llm("tiny")), **keys}))
    if multi is not None:
        (version / "multi_lora.json").write_text(json.dumps(multi))
    return read_engine_args(version, "m")


def test_model_json_and_multi_lora_json(tmp_path: Path, adapters: dict[str, Path]) -> None:
    """multi_lora.json (read when enable_lora is true; folders relative to the version folder)
    and lora_modules in both of vLLM's forms; refusals name the key or the folder."""
    (tmp_path / "1").mkdir()
    shutil.copytree(adapters["attn"], tmp_path / "1" / "attn")
    args = _read(
        tmp_path,
        {"enable_lora": "true", "lora_modules": [f"mlp={adapters['mlp']}"], "max_loras": 2},
        {"attn": "attn"},
    )
    assert args.enable_lora and args.max_loras == 2 and args.max_lora_rank == 16
    assert args.lora_modules == (("attn", tmp_path / "1" / "attn"), ("mlp", adapters["mlp"]))
    # Without enable_lora, Triton's backend does not read multi_lora.json.
    assert not _read(tmp_path, {}).enable_lora
    with pytest.raises(InferenceServerError, match="LoRA adapter 'x': no such folder nowhere"):
        _read(tmp_path, {"lora_modules": [{"name": "x", "path": "nowhere"}]})
    with pytest.raises(InferenceServerError, match='"transformers" engine only'):
        _read(tmp_path, {"enable_lora": True, "engine": "openvino"})


def test_a_request_for_an_adapter_of_a_model_without_lora_is_refused() -> None:
    folder = cached_llm("tiny")
    engine = Engine(EngineArgs(model=folder, tokenizer=folder))
    params = SamplingParams(max_tokens=2)
    try:
        with pytest.raises(InferenceServerError, match="without LoRA"):
            engine.submit(engine.encode("Hi"), params, lambda out: None, lora_name="x")
    finally:
        engine.close()


def test_adapters_over_int8_weights(adapters: dict[str, Path]) -> None:
    """quantization int8 keeps the base's linears int8; the adapters' deltas still apply (the
    output changes as the adapter asks: the first token equals peft's over float32 weights)."""
    engine = Engine(_args(adapters, quantization="int8"))
    try:
        tokens = _run(engine, [(name, 0) for name in [None, *ADAPTERS]])
    finally:
        engine.close()
    prompt = engine.encode(PROMPTS[0])
    assert len({tuple(t) for t in tokens}) == 4  # each adapter changes the output
    for name, got in zip([None, *ADAPTERS], tokens, strict=True):
        assert got[:1] == peft_greedy(adapters[name] if name else None, prompt, 1), name
