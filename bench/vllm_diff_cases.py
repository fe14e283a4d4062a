"""The requests bench/vllm_diff.py sends to vLLM and to Oceanus alike (the model is served as
`ref` by both, context 512). Each case is (name, method, path, body); a body that is bytes is
sent as it is (a broken JSON). Greedy cases (temperature 0) also compare texts and token counts.
"""

from __future__ import annotations

from typing import Any

M = "ref"
HI = [{"role": "user", "content": "Tell me about the ocean."}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
LONG = "waves " * 600  # more than the 512-token context
PROMPT = "The ocean covers most of the planet and"

Case = tuple[str, str, str, Any]


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": M, "messages": HI, "max_tokens": 8, "temperature": 0, **extra}


def _cmpl(**extra: Any) -> dict[str, Any]:
    return {"model": M, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, **extra}


def cases() -> list[Case]:
    chat = "/v1/chat/completions"
    cmpl = "/v1/completions"
    sampled = {"temperature": 0.9, "seed": 7}
    found: list[Case] = [
        # ---- chat
        ("chat", "POST", chat, _chat()),
        (
            "chat_max_completion_tokens",
            "POST",
            chat,
            _chat(max_tokens=None, max_completion_tokens=6),
        ),
        (
            "chat_system_developer",
            "POST",
            chat,
            _chat(
                messages=[
                    {"role": "system", "content": "Be brief."},
                    {"role": "developer", "content": "Answer in English."},
                    *HI,
                ]
            ),
        ),
        (
            "chat_parts",
            "POST",
            chat,
            _chat(messages=[{"role": "user", "content": [{"type": "text", "text": "Hello"}]}]),
        ),
        ("chat_n2_greedy", "POST", chat, _chat(n=2)),
        ("chat_n2_sampled", "POST", chat, _chat(n=2, **sampled)),
        ("chat_sampled_seed", "POST", chat, _chat(**sampled)),
        ("chat_logprobs", "POST", chat, _chat(logprobs=True, top_logprobs=3)),
        ("chat_logprobs_no_top", "POST", chat, _chat(logprobs=True)),
        ("chat_stop", "POST", chat, _chat(max_tokens=16, stop=["e", "a"])),
        (
            "chat_penalties",
            "POST",
            chat,
            _chat(presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.2),
        ),
        ("chat_top_k_min_p", "POST", chat, _chat(top_k=5, min_p=0.1, **sampled)),
        ("chat_logit_bias", "POST", chat, _chat(logit_bias={"300": 100})),
        ("chat_min_tokens_ignore_eos", "POST", chat, _chat(min_tokens=4, ignore_eos=True)),
        ("chat_stream", "POST", chat, _chat(stream=True)),
        (
            "chat_stream_usage",
            "POST",
            chat,
            _chat(stream=True, stream_options={"include_usage": True}),
        ),
        ("chat_stream_n2", "POST", chat, _chat(stream=True, n=2, **sampled)),
        ("chat_stream_logprobs", "POST", chat, _chat(stream=True, logprobs=True, top_logprobs=2)),
        ("chat_tools_auto", "POST", chat, _chat(tools=TOOLS, tool_choice="auto")),
        ("chat_tools_none", "POST", chat, _chat(tools=TOOLS, tool_choice="none")),
        (
            "chat_tools_required",
            "POST",
            chat,
            _chat(max_tokens=48, tools=TOOLS, tool_choice="required"),
        ),
        (
            "chat_tools_named",
            "POST",
            chat,
            _chat(
                max_tokens=48,
                tools=TOOLS,
                tool_choice={"type": "function", "function": {"name": "get_weather"}},
            ),
        ),
        (
            "chat_tools_named_stream",
            "POST",
            chat,
            _chat(
                max_tokens=48,
                stream=True,
                tools=TOOLS,
                tool_choice={"type": "function", "function": {"name": "get_weather"}},
            ),
        ),
        (
            "chat_json_object",
            "POST",
            chat,
            _chat(max_tokens=24, response_format={"type": "json_object"}),
        ),
        (
            "chat_json_schema",
            "POST",
            chat,
            _chat(
                max_tokens=48,
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "person", "schema": SCHEMA},
                },
            ),
        ),
        ("chat_prompt_logprobs", "POST", chat, _chat(prompt_logprobs=1)),
        # ---- chat errors
        ("chat_unknown_model", "POST", chat, _chat(model="nothing")),
        ("chat_missing_messages", "POST", chat, {"model": M}),
        ("chat_empty_messages", "POST", chat, _chat(messages=[])),
        ("chat_bad_role", "POST", chat, _chat(messages=[{"role": "robot", "content": "x"}])),
        ("chat_no_content", "POST", chat, _chat(messages=[{"role": "user"}])),
        ("chat_bad_temperature", "POST", chat, _chat(temperature=-1)),
        ("chat_bad_n", "POST", chat, _chat(n=0)),
        ("chat_top_logprobs_alone", "POST", chat, _chat(top_logprobs=2)),
        ("chat_too_many_top_logprobs", "POST", chat, _chat(logprobs=True, top_logprobs=30)),
        ("chat_too_long", "POST", chat, _chat(messages=[{"role": "user", "content": LONG}])),
        ("chat_max_tokens_too_big", "POST", chat, _chat(max_tokens=600)),
        ("chat_tool_choice_without_tools", "POST", chat, _chat(tool_choice="required")),
        (
            "chat_tool_choice_unknown_function",
            "POST",
            chat,
            _chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nothing"}}),
        ),
        ("chat_stream_prompt_logprobs", "POST", chat, _chat(stream=True, prompt_logprobs=1)),
        ("chat_broken_json", "POST", chat, b'{"model": "ref", "messages": ['),
        ("chat_string_max_tokens", "POST", chat, _chat(max_tokens="8")),
        # ---- completions
        ("cmpl", "POST", cmpl, _cmpl()),
        ("cmpl_default_max_tokens", "POST", cmpl, _cmpl(max_tokens=None)),
        ("cmpl_prompts", "POST", cmpl, _cmpl(prompt=[PROMPT, "Hello world"])),
        ("cmpl_token_ids", "POST", cmpl, _cmpl(prompt=[1, 300, 301, 302])),
        ("cmpl_token_id_lists", "POST", cmpl, _cmpl(prompt=[[1, 300, 301], [1, 400]])),
        ("cmpl_echo", "POST", cmpl, _cmpl(echo=True)),
        ("cmpl_echo_logprobs", "POST", cmpl, _cmpl(echo=True, logprobs=2)),
        ("cmpl_logprobs", "POST", cmpl, _cmpl(logprobs=3)),
        ("cmpl_logprobs_0", "POST", cmpl, _cmpl(logprobs=0)),
        ("cmpl_prompt_logprobs", "POST", cmpl, _cmpl(prompt_logprobs=2)),
        ("cmpl_stop", "POST", cmpl, _cmpl(max_tokens=16, stop=" ")),
        ("cmpl_penalties", "POST", cmpl, _cmpl(presence_penalty=1.0, frequency_penalty=0.3)),
        ("cmpl_n2_sampled", "POST", cmpl, _cmpl(n=2, **sampled)),
        ("cmpl_best_of", "POST", cmpl, _cmpl(n=1, best_of=2, **sampled)),
        (
            "cmpl_json_object",
            "POST",
            cmpl,
            _cmpl(max_tokens=24, response_format={"type": "json_object"}),
        ),
        ("cmpl_stream", "POST", cmpl, _cmpl(stream=True)),
        (
            "cmpl_stream_usage",
            "POST",
            cmpl,
            _cmpl(stream=True, stream_options={"include_usage": True}),
        ),
        ("cmpl_stream_echo", "POST", cmpl, _cmpl(stream=True, echo=True)),
        ("cmpl_stream_logprobs", "POST", cmpl, _cmpl(stream=True, logprobs=1)),
        (
            "cmpl_stream_prompts_n2",
            "POST",
            cmpl,
            _cmpl(stream=True, n=2, prompt=[PROMPT, "Hi"], **sampled),
        ),
        # ---- completions errors
        ("cmpl_unknown_model", "POST", cmpl, _cmpl(model="nothing")),
        ("cmpl_missing_prompt", "POST", cmpl, {"model": M}),
        ("cmpl_too_long", "POST", cmpl, _cmpl(prompt=LONG)),
        ("cmpl_max_tokens_too_big", "POST", cmpl, _cmpl(max_tokens=600)),
        ("cmpl_bad_max_tokens", "POST", cmpl, _cmpl(max_tokens=-1)),
        ("cmpl_too_many_logprobs", "POST", cmpl, _cmpl(logprobs=30)),
        ("cmpl_suffix", "POST", cmpl, _cmpl(suffix="end")),
        ("cmpl_best_of_below_n", "POST", cmpl, _cmpl(n=2, best_of=1)),
        ("cmpl_stream_prompt_logprobs", "POST", cmpl, _cmpl(stream=True, prompt_logprobs=1)),
        ("cmpl_bad_token_id", "POST", cmpl, _cmpl(prompt=[1, 999999])),
        # ---- the other routes
        ("models", "GET", "/v1/models", None),
        ("model", "GET", "/v1/models/ref", None),
        ("model_unknown", "GET", "/v1/models/nothing", None),
        ("health", "GET", "/health", None),
        ("version", "GET", "/version", None),
        ("tokenize_prompt", "POST", "/tokenize", {"model": M, "prompt": PROMPT}),
        (
            "tokenize_strs",
            "POST",
            "/tokenize",
            {"model": M, "prompt": PROMPT, "return_token_strs": True},
        ),
        ("tokenize_messages", "POST", "/tokenize", {"model": M, "messages": HI}),
        ("tokenize_missing", "POST", "/tokenize", {"model": M}),
        ("detokenize", "POST", "/detokenize", {"model": M, "tokens": [1, 300, 301]}),
        ("detokenize_missing", "POST", "/detokenize", {"model": M}),
        ("embeddings_on_generator", "POST", "/v1/embeddings", {"model": M, "input": "hi"}),
        ("score_on_generator", "POST", "/v1/score", {"model": M, "text_1": "a", "text_2": "b"}),
        (
            "responses",
            "POST",
            "/v1/responses",
            {"model": M, "input": "Hello", "max_output_tokens": 8, "temperature": 0},
        ),
        (
            "responses_stream",
            "POST",
            "/v1/responses",
            {
                "model": M,
                "input": "Hello",
                "max_output_tokens": 8,
                "temperature": 0,
                "stream": True,
            },
        ),
        (
            "messages",
            "POST",
            "/v1/messages",
            {"model": M, "max_tokens": 8, "temperature": 0, "messages": HI},
        ),
        (
            "messages_stream",
            "POST",
            "/v1/messages",
            {"model": M, "max_tokens": 8, "temperature": 0, "messages": HI, "stream": True},
        ),
        ("messages_missing_max_tokens", "POST", "/v1/messages", {"model": M, "messages": HI}),
        (
            "messages_count_tokens",
            "POST",
            "/v1/messages/count_tokens",
            {"model": M, "messages": HI},
        ),
        ("chat_wrong_method", "GET", chat, None),
        ("unknown_route", "POST", "/v1/nothing", {"model": M}),
    ]
    return found


QUERY = "What is the weather like in Paris?"
DOCUMENTS = ["It is sunny and warm in Paris", "Stock prices fell", "The weather is cold"]


def scoring_cases() -> list[Case]:
    """For a cross-encoder (oceanus/examples/cross_encoder.py) served as `ref`."""
    rerank = {"model": M, "query": QUERY, "documents": DOCUMENTS}
    return [
        ("score", "POST", "/v1/score", {"model": M, "text_1": QUERY, "text_2": DOCUMENTS}),
        ("score_one", "POST", "/score", {"model": M, "text_1": QUERY, "text_2": DOCUMENTS[0]}),
        (
            "score_pairwise",
            "POST",
            "/v1/score",
            {"model": M, "text_1": [QUERY, QUERY], "text_2": DOCUMENTS[:2]},
        ),
        (
            "score_mismatch",
            "POST",
            "/v1/score",
            {"model": M, "text_1": [QUERY, QUERY], "text_2": DOCUMENTS},
        ),
        (
            "score_unknown_model",
            "POST",
            "/v1/score",
            {"model": "nothing", "text_1": "a", "text_2": "b"},
        ),
        ("rerank", "POST", "/v1/rerank", rerank),
        ("rerank_top_n", "POST", "/rerank", {**rerank, "top_n": 2}),
        ("rerank_v2", "POST", "/v2/rerank", rerank),
        ("rerank_no_documents", "POST", "/v1/rerank", {**rerank, "documents": []}),
        ("rerank_missing_query", "POST", "/v1/rerank", {"model": M, "documents": DOCUMENTS}),
        ("embeddings_on_scorer", "POST", "/v1/embeddings", {"model": M, "input": "hi"}),
        ("chat_on_scorer", "POST", "/v1/chat/completions", {"model": M, "messages": HI}),
        ("models", "GET", "/v1/models", None),
    ]
