"""The LLM backend through a real server: Triton's vLLM model folders (and our own backend name)
with the generated tiny Llama model, its auto-completed config, greedy output equal to
transformers' own `generate` token for token (alone and batched with other requests),
streaming over SSE and gRPC, the vLLM backend's optional outputs, bad sampling parameters,
cancellation freeing the engine's slot, the vllm:* metrics, and the missing-extra error."""

from __future__ import annotations

import json
import queue
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch
import tritonclient.grpc as grpcclient
from transformers import AutoModelForCausalLM, AutoTokenizer

from oceanus.examples.llm import cached_llm, write_llm_model

sys.path.insert(0, str(Path(__file__).parent))
from llm_bls_model import BLS_CONFIG, BLS_MODEL
from llm_testlib import PROMPTS


@pytest.fixture(scope="module")
def llm_server(tmp_path_factory: pytest.TempPathFactory, launch_module: Any) -> Any:
    repo = tmp_path_factory.mktemp("llm_repo")
    write_llm_model(repo, "llm_tiny")
    write_llm_model(repo, "llm_own", backend="oceanus_llm")
    write_llm_model(repo, "llm_bf16", engine_args={"dtype": "bfloat16"})
    # One slot and a small prefill chunk: cancellation must free the slot; prompts prefill in
    # several steps.
    write_llm_model(
        repo,
        "llm_one_slot",
        engine_args={"max_num_seqs": 1, "max_num_batched_tokens": 8, "gpu_memory_utilization": 0.9},
    )
    bls = repo / "llm_bls"
    (bls / "1").mkdir(parents=True)
    (bls / "config.pbtxt").write_text(BLS_CONFIG)
    (bls / "1" / "model.py").write_text(BLS_MODEL)
    return launch_module([repo], ["--metrics-config", "histogram_latencies=true"])


@pytest.fixture(scope="module")
def reference() -> Iterator[tuple[Any, Any]]:
    folder = cached_llm("tiny")
    yield AutoTokenizer.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(folder)


def hf_greedy(reference: tuple[Any, Any], prompt: str, max_tokens: int) -> str:
    tokenizer, model = reference
    ids = torch.tensor([tokenizer(prompt)["input_ids"]])
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False
        )
    return str(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))


def post(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def generate(server: Any, model: str, body: dict[str, Any]) -> dict[str, Any]:
    status, data = post(f"http://{server.http_url}/v2/models/{model}/generate", body)
    assert status == 200, data
    return dict(json.loads(data))


def sse(server: Any, model: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    status, data = post(f"http://{server.http_url}/v2/models/{model}/generate_stream", body)
    assert status == 200, data
    lines = [line for line in data.decode().splitlines() if line.startswith("data: ")]
    return [json.loads(line[6:]) for line in lines]


def greedy(max_tokens: int) -> str:
    return json.dumps({"max_tokens": max_tokens, "temperature": 0})


def test_config_is_completed_as_triton_vllm_backend(llm_server: Any) -> None:
    with urllib.request.urlopen(f"http://{llm_server.http_url}/v2/models/llm_tiny/config") as r:
        config = json.loads(r.read())
    assert config["backend"] == "vllm"
    assert config["max_batch_size"] == 0
    assert config["model_transaction_policy"]["decoupled"] is True
    inputs = {t["name"]: (t["data_type"], t["optional"]) for t in config["input"]}
    assert inputs["text_input"] == ("TYPE_STRING", False)
    assert inputs["sampling_parameters"] == ("TYPE_STRING", True)
    assert inputs["stream"] == ("TYPE_BOOL", True)
    assert set(inputs) >= {
        "exclude_input_in_output",
        "return_finish_reason",
        "return_cumulative_logprob",
        "return_logprobs",
        "return_num_input_tokens",
        "return_num_output_tokens",
    }
    outputs = {t["name"]: t["data_type"] for t in config["output"]}
    assert outputs == {
        "text_output": "TYPE_STRING",
        "finish_reason": "TYPE_STRING",
        "cumulative_logprob": "TYPE_FP32",
        "logprobs": "TYPE_STRING",
        "num_input_tokens": "TYPE_UINT32",
        "num_output_tokens": "TYPE_UINT32",
    }
    # GPU-only model.json keys are accepted and said to be ignored.
    assert "key 'gpu_memory_utilization' ignored (GPU-only)" in llm_server.log()


def test_greedy_alone_equals_transformers_generate(llm_server: Any, reference: Any) -> None:
    for model in ("llm_tiny", "llm_own"):
        out = generate(
            llm_server,
            model,
            {
                "text_input": PROMPTS[0],
                "sampling_parameters": greedy(24),
                "exclude_input_in_output": True,
                "return_num_input_tokens": True,
                "return_num_output_tokens": True,
                "return_finish_reason": True,
            },
        )
        assert out["text_output"] == hf_greedy(reference, PROMPTS[0], 24)
        assert out["num_output_tokens"] == 24
        assert out["finish_reason"] == "length"
        assert out["num_input_tokens"] == len(reference[0](PROMPTS[0])["input_ids"])
    # Without exclude_input_in_output the text starts with the prompt (Triton's default).
    out = generate(llm_server, "llm_tiny", {"text_input": PROMPTS[0], "max_tokens": 4})
    assert out["text_output"].startswith(PROMPTS[0])


def test_a_bfloat16_model_serves_what_the_engine_decodes_in_bfloat16(llm_server: Any) -> None:
    """model.json `dtype: "bfloat16"` reaches the engine through the server: its greedy text is
    the in-process bfloat16 engine's (whose tokens test_llm_engine.py checks against
    transformers' bfloat16 logits), not the fp32 model's."""
    from oceanus.backends.llm.args import EngineArgs
    from oceanus.backends.llm.engine import Engine
    from oceanus.backends.llm.sampling import SamplingParams

    folder = cached_llm("tiny")
    engine = Engine(EngineArgs(model=folder, tokenizer=folder, dtype="bfloat16"))
    texts: dict[int, str] = {}
    done = threading.Semaphore(0)
    params = SamplingParams(max_tokens=32, temperature=0.0)

    def sink(index: int) -> Any:
        def take(out: Any) -> None:
            texts[index] = texts.get(index, "") + out.text
            if out.finished:
                done.release()

        return take

    try:
        for index, prompt in enumerate(PROMPTS):
            engine.submit(engine.encode(prompt), params, sink(index))
        for _ in PROMPTS:
            assert done.acquire(timeout=60)
    finally:
        engine.close()
    served: dict[str, list[str]] = {"llm_bf16": [], "llm_tiny": []}
    for model, outputs in served.items():
        for prompt in PROMPTS:
            body = {"text_input": prompt, "sampling_parameters": greedy(32)}
            out = generate(llm_server, model, {**body, "exclude_input_in_output": True})
            outputs.append(out["text_output"])
    assert served["llm_bf16"] == [texts[index] for index in range(len(PROMPTS))]
    # Not the fp32 model's texts: the dtype took effect (some greedy tokens part in bf16).
    assert served["llm_bf16"] != served["llm_tiny"]


def test_greedy_batched_over_grpc_stream_equals_generate(llm_server: Any, reference: Any) -> None:
    """Requests of different lengths run together (one joins while others decode): each text
    still equals transformers' own generate."""
    lengths = [40, 12, 30, 20]
    texts = stream_texts(llm_server, "llm_tiny", PROMPTS, lengths)
    for prompt, length, text in zip(PROMPTS, lengths, texts, strict=True):
        assert text == hf_greedy(reference, prompt, length)
    # With one slot and 8-token prefill chunks, the requests queue and prefill in chunks.
    texts = stream_texts(llm_server, "llm_one_slot", PROMPTS[:2], [10, 10])
    for prompt, text in zip(PROMPTS[:2], texts, strict=True):
        assert text == hf_greedy(reference, prompt, 10)


def stream_inputs(prompt: str, params: str, stream: bool = True) -> list[Any]:
    inputs = []
    for name, value, dtype in (
        ("text_input", np.array([prompt.encode()], dtype=np.object_), "BYTES"),
        ("stream", np.array([stream]), "BOOL"),
        ("sampling_parameters", np.array([params.encode()], dtype=np.object_), "BYTES"),
        ("exclude_input_in_output", np.array([True]), "BOOL"),
    ):
        tensor = grpcclient.InferInput(name, [1], dtype)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


def stream_texts(server: Any, model: str, prompts: list[str], lengths: list[int]) -> list[str]:
    """Send every prompt on one gRPC stream at once; the concatenated text of each."""
    results: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    pieces: dict[str, list[str]] = {str(i): [] for i in range(len(prompts))}
    for i, (prompt, length) in enumerate(zip(prompts, lengths, strict=True)):
        client.async_stream_infer(
            model,
            stream_inputs(prompt, greedy(length)),
            request_id=str(i),
            enable_empty_final_response=True,
        )
    finished = 0
    while finished < len(prompts):
        result, error = results.get(timeout=60)
        assert error is None, error
        response = result.get_response()
        if result.as_numpy("text_output") is not None:
            pieces[response.id].append(result.as_numpy("text_output")[0].decode())
        if response.parameters["triton_final_response"].bool_param:
            finished += 1
    client.stop_stream()
    client.close()
    return ["".join(pieces[str(i)]) for i in range(len(prompts))]


def test_streaming_sse_pieces_add_up(llm_server: Any, reference: Any) -> None:
    events = sse(
        llm_server,
        "llm_tiny",
        {
            "text_input": PROMPTS[2],
            "stream": True,
            "sampling_parameters": greedy(16),
            "return_num_output_tokens": True,
            "return_finish_reason": True,
            "return_cumulative_logprob": True,
        },
    )
    assert len(events) > 1
    assert "".join(e["text_output"] for e in events) == hf_greedy(reference, PROMPTS[2], 16)
    assert sum(e["num_output_tokens"] for e in events) == 16
    assert events[-1]["finish_reason"] == "length"
    assert all(e["finish_reason"] == "None" for e in events[:-1])
    assert events[-1]["cumulative_logprob"] < 0


def test_streaming_through_bls(llm_server: Any, reference: Any) -> None:
    """A Python model streams the LLM's answer through BLS, piece by piece."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(llm_server.http_url)
    prompt = httpclient.InferInput("PROMPT", [1], "BYTES")
    prompt.set_data_from_numpy(np.array([PROMPTS[3].encode()], dtype=np.object_))
    result = client.infer("llm_bls", [prompt])
    assert result.as_numpy("TEXT")[0].decode() == hf_greedy(reference, PROMPTS[3], 12)
    assert result.as_numpy("COUNT")[0] > 1


def test_logprobs_output(llm_server: Any) -> None:
    out = generate(
        llm_server,
        "llm_tiny",
        {
            "text_input": PROMPTS[0],
            "sampling_parameters": json.dumps({"max_tokens": 3, "temperature": 0, "logprobs": 2}),
            "return_logprobs": True,
        },
    )
    tokens = json.loads(out["logprobs"])
    assert len(tokens) == 3
    for token in tokens:
        ranks = sorted(entry["rank"] for entry in token.values())
        assert ranks[0] == 1 and all(entry["logprob"] <= 0 for entry in token.values())
    # Not asked for in the sampling parameters: null, as vLLM says it.
    out = generate(
        llm_server, "llm_tiny", {"text_input": "x", "max_tokens": 2, "return_logprobs": True}
    )
    assert out["logprobs"] == "null"


def test_sampling_with_a_seed_repeats_and_stop_strings_cut(llm_server: Any) -> None:
    params = json.dumps({"max_tokens": 12, "temperature": 0.8, "top_p": 0.9, "seed": 7})
    body = {"text_input": PROMPTS[1], "sampling_parameters": params}
    first = generate(llm_server, "llm_tiny", body)["text_output"]
    assert generate(llm_server, "llm_tiny", body)["text_output"] == first
    full = generate(
        llm_server,
        "llm_tiny",
        {
            "text_input": PROMPTS[0],
            "sampling_parameters": greedy(20),
            "exclude_input_in_output": True,
        },
    )["text_output"]
    # A stop string of plain letters (the random model also writes partial UTF-8 bytes, whose
    # "\ufffd" may only become final text a token later).
    stop = next(w for w in re.findall(r"[a-z]{3,}", full[3:]))
    cut = generate(
        llm_server,
        "llm_tiny",
        {
            "text_input": PROMPTS[0],
            "sampling_parameters": json.dumps({"max_tokens": 20, "temperature": 0, "stop": [stop]}),
            "exclude_input_in_output": True,
            "return_finish_reason": True,
        },
    )
    assert cut["text_output"] == full[: full.find(stop)]
    assert cut["finish_reason"] == "stop"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"sampling_parameters": '{"max_tokens": 0}'}, "max_tokens must be at least 1"),
        ({"sampling_parameters": '{"tempo": 1}'}, "unknown sampling parameter 'tempo'"),
        ({"sampling_parameters": "not json"}, "sampling_parameters is not valid JSON"),
        ({"stream": True, "exclude_input_in_output": False}, "When streaming"),
    ],
)
def test_bad_requests_get_clear_errors(llm_server: Any, body: dict[str, Any], words: str) -> None:
    endpoint = "generate_stream" if body.get("stream") else "generate"
    status, data = post(
        f"http://{llm_server.http_url}/v2/models/llm_tiny/{endpoint}",
        {"text_input": "hello", **body},
    )
    assert words in data.decode(), data
    if endpoint == "generate":
        assert status == 400, data


def metrics(server: Any) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as r:
        return str(r.read().decode())


def metric_value(text: str, name: str, model: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and f'model="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} for {model} not in /metrics")


def test_cancelled_stream_frees_the_only_slot(llm_server: Any) -> None:
    """llm_one_slot has one slot: a long generation cancelled by its client must leave it at the
    next step, or the next request would wait for all 900 tokens."""
    got_first = threading.Event()
    client = grpcclient.InferenceServerClient(llm_server.grpc_url)
    client.start_stream(callback=lambda result, error: got_first.set())
    client.async_stream_infer(
        "llm_one_slot",
        stream_inputs(PROMPTS[0], json.dumps({"max_tokens": 900, "ignore_eos": True})),
        request_id="long",
    )
    assert got_first.wait(60)
    client.stop_stream(cancel_requests=True)
    client.close()
    # ignore_eos: sampled at temperature 1 (seeded by arrival time), the tiny model ends "x"
    # with EOS within two tokens about once in 80 tries, which read as a flake under load.
    out = generate(
        llm_server,
        "llm_one_slot",
        {"text_input": "x", "max_tokens": 3, "ignore_eos": True, "return_num_output_tokens": True},
    )
    assert out["num_output_tokens"] == 3
    text = metrics(llm_server)
    # The cancelled request generated far fewer than its 900 tokens.
    assert metric_value(text, "vllm:generation_tokens_total", "llm_one_slot") < 600
    assert metric_value(text, "vllm:num_requests_running", "llm_one_slot") == 0


def test_the_prefix_cache_counters_count_tokens(llm_server: Any) -> None:
    """vLLM v1's prefix-cache counters, in tokens: the same long prompt twice, the second
    finds every whole block of it cached (the engine's default block_size 16)."""
    hits, queries = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"
    before = metrics(llm_server)
    body = {"text_input": PROMPTS[3] + " " + PROMPTS[1], "max_tokens": 2}
    generate(llm_server, "llm_own", body)
    generate(llm_server, "llm_own", body)
    after = metrics(llm_server)
    asked = metric_value(after, queries, "llm_own") - metric_value(before, queries, "llm_own")
    found = metric_value(after, hits, "llm_own") - metric_value(before, hits, "llm_own")
    assert asked > 32 and found >= 16 and found % 16 == 0 and found <= asked


def test_vllm_metrics_are_labelled_by_model_and_version(llm_server: Any) -> None:
    generate(llm_server, "llm_own", {"text_input": "hello", "max_tokens": 5})
    text = metrics(llm_server)
    for name in (
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:time_to_first_token_seconds_count",
        "vllm:time_per_output_token_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:request_prompt_tokens_count",
        "vllm:request_generation_tokens_count",
        "vllm:lora_requests_info",
    ):
        assert metric_value(text, name, "llm_own") >= 0
    # Triton's vLLM backend's labels, and vLLM's own `model_name` (what routers select on)
    labels = 'engine="0",model="llm_own",model_name="llm_own",version="1"'
    assert f"vllm:generation_tokens_total{{{labels}}}" in text
    lora = 'vllm:lora_requests_info{engine="0",max_lora="0",model="llm_own",model_name="llm_own",'
    assert lora + 'running_lora_adapters="",version="1",waiting_lora_adapters=""}' in text
    # its value is the time of the last engine step, as vLLM's
    assert abs(metric_value(text, "vllm:lora_requests_info", "llm_own") - time.time()) < 600
    assert metric_value(text, "vllm:generation_tokens_total", "llm_own") >= 5
    # Triton's first-response histogram: once per request, when its first response left (not
    # when the engine admitted it).
    first = [
        line
        for line in text.splitlines()
        if line.startswith("nv_inference_first_response_histogram_ms_count")
        and 'model="llm_own"' in line
    ]
    assert first, "no first-response histogram for llm_own"
    success = metric_value(text, "nv_inference_request_success", "llm_own")
    assert float(first[0].rsplit(" ", 1)[1]) == success >= 1


def test_without_the_extra_the_error_names_it(tmp_path: Path) -> None:
    """transformers made unimportable: loading a vLLM folder names the pip extra."""
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "from oceanus.backends.builtin import registry\n"
        "try:\n    registry(entry_points=False).get('vllm', 'my_llm')\n"
        "except Exception as exc:\n    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert "unable to load model 'my_llm'" in out
    assert "pip install 'oceanus[llm]'" in out
