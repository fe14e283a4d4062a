"""Guided decoding (structured output) on model.json's `engine: "openvino"`: GenAI's xgrammar on
the tokenizer converted to OpenVINO. The tiny model has random weights, so only the grammar
makes its replies match: choices, regexes and JSON schemas (ones without room for free
whitespace, which xgrammar's JSON allows) hold under sampling; a grammar xgrammar refuses is
that request's INVALID_ARG while another runs on; a Lark grammar is refused naming the engine
that runs it. Through the server: the openai client's `response_format` json_schema."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("openvino_genai")
pytest.importorskip("openvino_tokenizers")

from oceanus.backends.llm.args import EngineArgs
from oceanus.backends.llm.openvino_engine import OpenVinoEngine
from oceanus.backends.llm.openvino_export import cached_tokenizer
from oceanus.backends.llm.sampling import SamplingParams
from oceanus.core.errors import ErrorCode, InferenceServerError
from oceanus.examples.llm import cached_llm, write_llm_model

sys.path.insert(0, str(Path(__file__).parent))
from llm_testlib import PROMPTS, Collect


@pytest.fixture(scope="module")
def engine() -> Any:
    folder = cached_llm("tiny")
    args = EngineArgs(model=folder, tokenizer=folder, engine="openvino")
    engine = OpenVinoEngine(args, threads=2)
    yield engine
    engine.close()


def guided(spec: dict[str, Any], seed: int, max_tokens: int = 24) -> SamplingParams:
    """Sampled (temperature 1, a seed each): the random model wanders, the grammar holds it."""
    return SamplingParams(
        max_tokens=max_tokens, temperature=1.0, seed=seed, guided_decoding=json.dumps(spec)
    )


def run(engine: Any, params: SamplingParams, prompt: str = PROMPTS[0]) -> tuple[str, str]:
    """The reply's text and finish reason."""
    sink = Collect()
    engine.submit(engine.encode(prompt), params, sink)
    text = sink.text
    return text, str(sink.outputs[-1].finish_reason)


def test_choices_and_regexes_are_matched(engine: Any) -> None:
    choices = ["yes", "no", "maybe so", "a+b (c)"]  # a space and regex characters: literal
    seen = set()
    for seed in range(6):
        text, reason = run(engine, guided({"choice": choices}, seed))
        assert (text in choices, reason) == (True, "stop")
        seen.add(text)
    assert len(seen) > 1  # sampling reached more than one: the grammar, not one fixed path
    pattern = r"[0-9]{3}-[a-c]{2,4}"
    for seed in range(4):
        text, reason = run(engine, guided({"regex": pattern}, seed))
        assert re.fullmatch(pattern, text) and reason == "stop"


def test_the_default_engine_takes_the_same_choices_literally() -> None:
    """guide.py's `choice_regex` (escaping only what either dialect treats as special) serves
    the transformers engine's llguidance too."""
    pytest.importorskip("llguidance")
    from oceanus.backends.llm.engine import Engine
    from oceanus.backends.llm.sampling import compile_guide

    folder = cached_llm("tiny")
    default = Engine(EngineArgs(model=folder, tokenizer=folder))
    try:
        choices = ["maybe so", "a+b (c)", "x|y"]
        for seed in range(3):
            text, reason = run(default, compile_guide(guided({"choice": choices}, seed)))
            assert (text in choices, reason) == (True, "stop")
    finally:
        default.close()


@pytest.mark.parametrize("more", [{"ignore_eos": True}, {"min_tokens": 6}])
def test_a_guided_reply_ends_with_its_grammar(engine: Any, more: dict[str, Any]) -> None:
    """As on the default engine (its grammar's completion ends the reply): the pipeline, told to
    ignore EOS, would go on past the grammar in free text; held to min_tokens, it would add
    special tokens."""
    params = guided({"choice": ["yes", "no"]}, 0, max_tokens=12)
    sink = Collect()
    engine.submit(engine.encode(PROMPTS[0]), dataclasses.replace(params, **more), sink)
    text, last = sink.text, sink.outputs[-1]
    assert (text in ("yes", "no"), last.finish_reason) == (True, "stop")
    tokens = [t for out in sink.outputs for t in out.token_ids]
    assert tokens[-1] == engine.eos  # the reply's own tokens, then EOS: nothing special between
    assert engine.tokenizer.decode(tokens[:-1], skip_special_tokens=False) == text


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "enum": ["alpha", "beta"]},
        {"type": "integer", "minimum": 0, "maximum": 999},
        {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 1},
    ],
)
def test_json_schemas_parse_and_validate(engine: Any, schema: dict[str, Any]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    for seed in range(3):
        text, reason = run(engine, guided({"json": schema}, seed, max_tokens=32))
        assert reason == "stop", text
        jsonschema.validate(json.loads(text), schema)


def test_json_object_starts_an_object(engine: Any) -> None:
    """Any JSON object: with free whitespace the random model may not close it in 16 tokens,
    but what it writes is an object's start."""
    text, _ = run(engine, guided({"json_object": True}, 0, max_tokens=16))
    assert text.lstrip().startswith("{")


def test_a_grammar_xgrammar_refuses_fails_that_request_only(engine: Any) -> None:
    """`\\p{L}` passes the frontend's check (llguidance) and not xgrammar's: unchecked, it would
    throw inside the pipeline's step and break it for every request (openvino_grammar.py)."""
    running = Collect()
    free = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    with engine._cond:  # hold the step loop: both reach the worker in one batch
        engine.submit(engine.encode(PROMPTS[1]), free, running)
        bad = Collect()
        engine.submit(engine.encode(PROMPTS[2]), guided({"regex": r"\p{L}+"}, 0), bad)
    last = bad.wait()[-1]
    assert last.error is not None and last.error.code == ErrorCode.INVALID_ARG
    assert "guided_decoding: Regex parsing error" in last.error.message
    ended = running.wait()[-1]
    assert (ended.error, ended.finish_reason, ended.num_output_tokens) == (None, "length", 40)
    text, reason = run(engine, guided({"choice": ["up", "down"]}, 1))  # the engine serves on
    assert text in ("up", "down") and reason == "stop"
    again = Collect()  # the verdict is remembered: refused again, without a compile
    engine.submit(engine.encode(PROMPTS[2]), guided({"regex": r"\p{L}+"}, 1), again)
    error = again.wait()[-1].error
    assert error is not None and error.code == ErrorCode.INVALID_ARG


def test_a_lark_grammar_is_refused_naming_the_engine_that_runs_it(engine: Any) -> None:
    params = guided({"grammar": 'start: "a" | "b"'}, 0)
    with pytest.raises(
        InferenceServerError, match=r"Lark grammar.*\"engine\": \"transformers\" in model.json"
    ) as caught:
        engine.submit(engine.encode("x"), params, Collect())
    assert caught.value.code == ErrorCode.INVALID_ARG


@pytest.mark.parametrize(("begin", "end"), [("<tool_call>", "</tool_call>"), ("[TOOL_CALLS]", "")])
def test_a_tool_call_between_its_markers(engine: Any, begin: str, end: str) -> None:
    """`tagged_json`, what the OpenAI frontend sends for tool_choice "required": the parser's
    markers around a JSON schema (llguidance's "x-guidance" settings dropped for xgrammar).
    A string enum leaves xgrammar's JSON no room for blanks, where random weights wander."""
    schema = {"x-guidance": {"whitespace_flexible": False}, "enum": ["Oslo", "Rome"]}
    spec = {"tagged_json": {"begin": begin, "schema": schema, "end": end}}
    for seed in range(3):
        text, reason = run(engine, guided(spec, seed, max_tokens=80))
        assert re.fullmatch(re.escape(begin) + '"(Oslo|Rome)"' + re.escape(end), text), text
        assert reason == "stop"


def test_the_tokenizer_is_converted_once_into_the_cache() -> None:
    folder = cached_llm("tiny")
    converted = cached_tokenizer(folder)
    assert {p.name for p in converted.glob("*.xml")} == {
        "openvino_tokenizer.xml",
        "openvino_detokenizer.xml",
    }
    mtime = (converted / "openvino_tokenizer.xml").stat().st_mtime_ns
    assert cached_tokenizer(folder) == converted
    assert (converted / "openvino_tokenizer.xml").stat().st_mtime_ns == mtime


def test_response_format_through_the_openai_client(tmp_path: Path, launch: Any) -> None:
    openai = pytest.importorskip("openai")
    write_llm_model(tmp_path, "llm_ov", engine_args={"engine": "openvino"})
    server = launch([tmp_path])
    client = openai.OpenAI(base_url=f"http://{server.http_url}/v1", api_key="unused")
    schema = {"type": "string", "enum": ["small", "medium", "large"]}
    for seed in range(2):
        reply = client.chat.completions.create(
            model="llm_ov",
            messages=[{"role": "user", "content": "How big?"}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "size", "schema": schema, "strict": True},
            },
            max_tokens=16,
            seed=seed,
        )
        assert reply.choices[0].finish_reason == "stop"
        assert json.loads(reply.choices[0].message.content) in schema["enum"]
    # A regex xgrammar refuses (llguidance, the frontend's check, takes it): a 400 naming it.
    regex = json.dumps({"regex": r"\p{L}+"})  # a text: /generate's parameters are scalars
    body = {"text_input": "x", "max_tokens": 4, "guided_decoding": regex}
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/llm_ov/generate",
        data=json.dumps(body).encode(),
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=60)
    assert caught.value.code == 400
    assert "Unicode character class" in caught.value.read().decode()
