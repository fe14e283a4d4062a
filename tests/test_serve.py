"""`oceanus serve MODEL [flags]` (oceanus/serve.py): vLLM's command line over the engine. Real
servers on loopback, the official `openai` client: chat and streams under the served name, the
four gauges routers read on the same port moving under load, `--api-key`, the tool-call and
reasoning parsers, GPU-only flags ignored, LoRA refused at start."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from oceanus.serve import folder_name, model_json, parse_args

openai = pytest.importorskip("openai")
pytest.importorskip("transformers")
pytest.importorskip("torch")

from oceanus.examples.llm import cached_llm  # noqa: E402
from tests.conftest import free_port  # noqa: E402

KEY = "sesame"


# ---- the command line ----------------------------------------------------------------------


def test_vllm_flags_map_to_model_json_and_gpu_flags_are_ignored() -> None:
    settings, ignored = parse_args(
        [
            "--tensor-parallel-size",
            "2",
            "--enforce-eager",
            "/models/qwen",
            "--served-model-name",
            "Qwen/Qwen3-0.6B",
            "qwen",
            "--max-model-len=2k",
            "--dtype",
            "bfloat16",
            "--max-num-seqs",
            "4",
            "--gpu-memory-utilization=0.9",
            "--kv-cache-dtype",
            "fp8",
            "--tool-call-parser",
            "hermes",
            "--enable-auto-tool-choice",
        ]
    )
    assert ignored == ["--tensor-parallel-size", "--enforce-eager", "--gpu-memory-utilization"]
    assert settings.model == "/models/qwen"
    assert settings.served_model_name == ["Qwen/Qwen3-0.6B", "qwen"]
    assert settings.max_model_len == 2000 and settings.max_num_seqs == 4
    assert settings.tool_call_parser == "hermes" and settings.enable_auto_tool_choice
    document = model_json(settings)
    assert document["served_model_name"] == "Qwen/Qwen3-0.6B"
    assert document["dtype"] == "bfloat16" and document["max_model_len"] == 2000
    assert "kv_cache_dtype" not in document  # fp8 is GPU-only: ignored
    assert folder_name("Qwen/Qwen3-0.6B") == "Qwen--Qwen3-0.6B"
    assert parse_args(["/mnt/models"])[0].served_model_name == ["/mnt/models"]  # vLLM's default
    assert model_json(parse_args(["m", "--seed", "0"])[0])["seed"] == 0
    off = model_json(parse_args(["m", "--no-enable-prefix-caching"])[0])
    assert off["enable_prefix_caching"] is False
    assert "enable_prefix_caching" not in model_json(parse_args(["m"])[0])  # on, vLLM's default
    quantized = model_json(parse_args(["m", "-q", "int4", "--engine", "openvino"])[0])
    assert (quantized["quantization"], quantized["engine"]) == ("int4", "openvino")
    assert "quantization" not in model_json(parse_args(["m"])[0])
    assert model_json(parse_args(["m", "--runner", "pooling"])[0])["runner"] == "pooling"
    assert model_json(parse_args(["m", "--task", "embed"])[0])["task"] == "embed"
    assert "runner" not in model_json(parse_args(["m"])[0])
    assert "engine" not in model_json(parse_args(["m"])[0])  # "auto"


def test_lora_flags_reach_model_json() -> None:
    settings, _ = parse_args(
        ["m", "--enable-lora", "--lora-modules", "a=/x", '{"name":"b","path":"/y"}']
    )
    document = model_json(settings)
    assert document["enable_lora"] is True
    assert document["lora_modules"] == [{"name": "a", "path": "/x"}, {"name": "b", "path": "/y"}]
    assert "max_loras" not in document  # vLLM's defaults are model.json's
    settings, _ = parse_args(
        ["m", "--enable-lora", "--lora-modules", "c=tests", "--max-loras", "4", "--max-lora-rank=8"]
    )
    document = model_json(settings)
    # A relative folder is the working directory's: made absolute for the model.json elsewhere.
    assert document["lora_modules"] == [{"name": "c", "path": str(Path("tests").resolve())}]
    assert (document["max_loras"], document["max_lora_rank"]) == (4, 8)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ([], "no MODEL given"),
        (["m", "--tool-call-parser", "pythonic"], "tool call parser 'pythonic' is not available"),
        (["m", "--reasoning-parser", "gpt_oss"], "reasoning parser 'gpt_oss' is not available"),
        (["m", "--max-model-len", "lots"], "invalid length 'lots'"),
    ],
)
def test_bad_flags_exit_2(args: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(args)
    assert exited.value.code == 2
    assert words in capsys.readouterr().err


def test_no_subcommand_keeps_tritonservers_flags() -> None:
    from oceanus.cli import parse_args as triton_args

    settings, _ = triton_args(["--http-port=8123", "--allow-grpc=false"])
    assert settings.http_port == 8123 and not settings.allow_grpc


# ---- a served model ------------------------------------------------------------------------


class Served:
    def __init__(self, args: list[str], log: Path) -> None:
        self.port = free_port()
        self.log_path = log
        command = [sys.executable, "-m", "oceanus", "serve", str(cached_llm("tiny"))]
        command += ["--host", "127.0.0.1", "--port", str(self.port), *args]
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT)

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def wait_healthy(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"exited {self.process.returncode}:\n{self.log_path.read_text()}"
                )
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"not healthy after {timeout} s:\n{self.log_path.read_text()}")

    def gauge(self, name: str) -> float:
        for line in self.get("/metrics")[1].splitlines():
            if line.startswith(name + "{") and 'model_name="m"' in line:
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f'{name} with model_name="m" not in /metrics')

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


def _until(check: Callable[[], bool], timeout: float = 60) -> None:
    """Wait for a condition the server reaches (its gauges are read after each engine step)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    server = Served(
        [
            "--served-model-name",
            "m",
            "--max-model-len",
            "4096",
            "--max-num-seqs",
            "1",
            "--api-key",
            KEY,
            "--tool-call-parser",
            "hermes",
            "--enable-auto-tool-choice",
            "--gpu-memory-utilization",
            "0.9",
            "--enforce-eager",
            # The tool-call test's JSON needs compact guided JSON: the openvino engine's
            # (xgrammar's) allows free whitespace, where random weights wander.
            "--engine",
            "transformers",
        ],
        log,
    )
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


def _client(served: Served, key: str = KEY) -> Any:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{served.port}/v1", api_key=key)


def test_the_openai_client_chats_and_streams_under_the_served_name(served: Served) -> None:
    client = _client(served)
    assert [m.id for m in client.models.list().data] == ["m"]
    messages = [{"role": "user", "content": "Hello"}]
    whole = client.chat.completions.create(
        model="m", messages=messages, max_tokens=8, temperature=0
    )
    assert whole.model == "m" and whole.usage.completion_tokens <= 8
    chunks = list(
        client.chat.completions.create(
            model="m", messages=messages, max_tokens=8, temperature=0, stream=True
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert "ignored" in served.log_path.read_text()  # --gpu-memory-utilization, --enforce-eager


def test_api_key_guards_the_api_not_the_probes(served: Served) -> None:
    with pytest.raises(openai.AuthenticationError) as caught:
        _client(served, "wrong").models.list()
    assert caught.value.status_code == 401
    assert caught.value.body["code"] == "invalid_api_key"  # OpenAI's error shape
    assert served.get("/health")[0] == 200  # probes and scrapes need no key, as in vLLM
    assert served.get("/metrics")[0] == 200
    assert served.get("/v2/health/ready")[0] == 200  # KServe's probes too
    assert served.get("/v2/models/m")[0] == 401  # vLLM guards /v2 as well
    url = f"http://127.0.0.1:{served.port}/v1/models"
    asked = urllib.request.Request(url, headers={"Authorization": f"bearer {KEY}"})
    with urllib.request.urlopen(asked, timeout=5) as reply:  # the scheme in any case, as vLLM
        assert reply.status == 200


def test_tool_choice_required_uses_the_named_parser(served: Served) -> None:
    pytest.importorskip("llguidance")
    tools = [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 3}},
                    "required": ["city"],
                    "additionalProperties": False,
                },
            },
        }
    ]
    reply = _client(served).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Weather?"}],
        tools=tools,
        tool_choice="required",
    )
    call = reply.choices[0].message.tool_calls[0]
    assert call.function.name == "weather" and "city" in json.loads(call.function.arguments)
    assert reply.choices[0].finish_reason == "tool_calls"


def test_the_four_gauges_move_under_load(served: Served) -> None:
    """One slot (--max-num-seqs 1): a long stream holds it (running 1, KV in use); three more
    requests then wait, as vLLM counts them (waiting 3: the one the engine was handed and the
    two in the server's queue); all cut, the gauges fall back to 0."""
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:lora_requests_info",
    ):
        served.gauge(name)  # present, labelled model_name="m"
    client = _client(served)
    long = {"max_tokens": 4000, "extra_body": {"ignore_eos": True}, "stream": True}
    held = client.completions.create(model="m", prompt="Once", **long)
    next(iter(held))  # its first chunk: it is running
    _until(lambda: served.gauge("vllm:num_requests_running") == 1)
    assert 0 < served.gauge("vllm:kv_cache_usage_perc") <= 1

    def ask() -> None:  # answered once admitted; then cut at once, letting the next one in
        client.completions.create(model="m", prompt="Twice", **long).close()

    waiting = [threading.Thread(target=ask) for _ in range(3)]
    for thread in waiting:
        thread.start()
    _until(lambda: served.gauge("vllm:num_requests_waiting") == 3)
    assert served.gauge("vllm:num_requests_running") == 1
    held.close()
    for thread in waiting:
        thread.join(60)
    _until(
        lambda: (
            served.gauge("vllm:num_requests_running") == 0
            and served.gauge("vllm:num_requests_waiting") == 0
        )
    )


def test_reasoning_parser_and_a_missing_lora_folder(tmp_path: Path) -> None:
    """deepseek_r1 reads a reply without </think> as all reasoning (vLLM's reading): the random
    model's reply comes back as reasoning_content, whole and streamed alike. An adapter folder
    that is not there fails the start, naming it."""
    server = Served(
        ["--served-model-name", "m", "--reasoning-parser", "deepseek_r1"], tmp_path / "r"
    )
    try:
        server.wait_healthy()
        client = _client(server, "unused")
        messages = [{"role": "user", "content": "Think"}]
        whole = client.chat.completions.create(
            model="m", messages=messages, max_tokens=8, temperature=0
        )
        message = whole.choices[0].message
        assert message.reasoning_content and message.content is None
        streamed = client.chat.completions.create(
            model="m", messages=messages, max_tokens=8, temperature=0, stream=True
        )
        thought = content = ""
        for chunk in streamed:
            if chunk.choices:
                thought += getattr(chunk.choices[0].delta, "reasoning_content", None) or ""
                content += chunk.choices[0].delta.content or ""
        assert (thought, content) == (message.reasoning_content, "")
    finally:
        server.stop()
    lora = Served(["--enable-lora", "--lora-modules", "a=/nowhere"], tmp_path / "lora")
    try:
        assert lora.process.wait(180) == 1
        assert "LoRA adapter 'a': no such folder /nowhere" in lora.log_path.read_text()
    finally:
        lora.stop()
