"""Chat and completion request bodies -> a `Plan`: the prompts (rendered and counted with the
model's tokenizer), the sampling parameters, and how the reply is read back (echo, logprobs,
tool calls). Every mistake is a 400 that names its field, before anything is queued."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from oceanus.frontends.openai import sampling
from oceanus.frontends.openai.errors import bad_request
from oceanus.frontends.openai.tokenizer import ModelTokenizer
from oceanus.frontends.openai.tools import Parser

MAX_N = 16
_ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass
class Prompt:
    text: str
    tokens: int | None  # counted by the model's tokenizer (None: no tokenizer)
    max_tokens: int | None
    ids: list[int] | None = None  # the prompt tokenized (None: no tokenizer)


@dataclass
class Plan:
    chat: bool
    model: str
    prompts: list[Prompt]
    parameters: dict[str, Any]
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    echo: bool = False
    logprobs: int | None = None  # top logprobs to return (None: no logprobs)
    parser: Parser | None = None  # tool calls are parsed from the reply
    named_tool: str | None = None  # tool_choice named this function
    # The model is the built-in engine: its requests carry the prompts' ids and typed sampling
    # parameters (core.generation) instead of the vLLM backend's tensors.
    typed: bool = False
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))


def _stream_options(body: dict[str, Any], stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise bad_request(
            "'stream_options' is only allowed when 'stream' is true", "stream_options"
        )
    if not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object", "stream_options")
    return bool(options.get("include_usage"))


def _common(body: dict[str, Any]) -> tuple[int, bool, bool]:
    n = sampling.positive_int(body, "n") or 1
    if n > MAX_N:
        raise bad_request(f"'n' must be at most {MAX_N}, got {n}", "n")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean", "stream")
    return n, stream, _stream_options(body, stream)


def _room(
    prompt_tokens: int | None, asked: int | None, context: int | None, what: str
) -> int | None:
    """max_tokens for one prompt: as asked, or what the context leaves (OpenAI's default of 16
    cut most replies short); a prompt the context cannot hold is a 400 naming both lengths."""
    if context is None or prompt_tokens is None:
        return asked
    if prompt_tokens >= context:
        raise bad_request(
            f"This model's maximum context length is {context} tokens. However, your {what} "
            f"resulted in {prompt_tokens} tokens. Please reduce the length of the {what}.",
            "messages" if what == "messages" else "prompt",
        )
    if asked is None:
        return context - prompt_tokens
    if prompt_tokens + asked > context:
        raise bad_request(
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{prompt_tokens + asked} tokens ({prompt_tokens} in the {what}, {asked} in the "
            "completion). Please reduce the length of the messages or completion.",
            "max_tokens",
        )
    return asked


def _guide(parameters: dict[str, Any], guide: dict[str, Any], param: str) -> None:
    """Structured output for the engine, as Triton's frontend sends it to its vLLM backend: a
    JSON text of vLLM's GuidedDecodingParams under `guided_decoding`. A schema the grammar
    library (llguidance, docs/openai.md) cannot compile is a 400 here, before any queueing."""
    # Without the library the model checks it (or refuses guided decoding).
    if "json" in guide and importlib.util.find_spec("llguidance") is not None:
        import llguidance

        matcher = llguidance.LLMatcher
        try:
            error = matcher.validate_grammar(
                matcher.grammar_from_json_schema(json.dumps(guide["json"]))
            )
        except Exception as exc:  # the library refuses it before validation
            error = str(exc)
        if error:
            raise bad_request(f"the JSON schema cannot be compiled: {error}", param)
    parameters["guided_decoding"] = json.dumps(guide)


def _response_format(body: dict[str, Any], parameters: dict[str, Any]) -> None:
    response_format = body.get("response_format")
    if response_format is None:
        return
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return
    if kind == "json_object":
        _guide(parameters, {"json_object": True}, "response_format")
        return
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise bad_request(
                "'response_format.json_schema.schema' must be an object", "response_format"
            )
        _guide(parameters, {"json": schema}, "response_format")
        return
    raise bad_request(
        "'response_format.type' must be 'text', 'json_object' or 'json_schema'", "response_format"
    )


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list", "messages")
    shown = []
    for number, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise bad_request(
                f"messages[{number}] must be an object whose 'role' is one of {', '.join(_ROLES)}",
                "messages",
            )
        message = dict(message)
        if message["role"] == "developer":  # OpenAI's newer name; templates know "system"
            message["role"] = "system"
        content = message.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text":
                    raise bad_request(
                        f"messages[{number}]: only text content parts are supported", "messages"
                    )
                texts.append(str(part.get("text", "")))
            message["content"] = "".join(texts)
        elif content is not None and not isinstance(content, str):
            raise bad_request(f"messages[{number}].content must be a string or a list", "messages")
        for call in message.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                # templates write the arguments as an object, as transformers passes them
                with contextlib.suppress(ValueError):
                    function["arguments"] = json.loads(function["arguments"])
        shown.append(message)
    return shown


def _tools(
    body: dict[str, Any], parameters: dict[str, Any]
) -> tuple[list[Any] | None, str, str | None]:
    """(the tools for the template, the tool_choice mode, the named function)."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools is None:
        if choice not in (None, "none"):
            raise bad_request("'tool_choice' needs 'tools'", "tool_choice")
        return None, "none", None
    if not isinstance(tools, list) or not all(
        isinstance(t, dict) and isinstance(t.get("function"), dict) and t["function"].get("name")
        for t in tools
    ):
        raise bad_request(
            "'tools' must be a list of {'type': 'function', 'function': {...}}", "tools"
        )
    if choice is None:
        choice = "auto"
    if choice in ("auto", "required"):
        return tools, choice, None
    if choice == "none":
        return None, "none", None
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    by_name = {t["function"]["name"]: t["function"] for t in tools}
    if name not in by_name:
        raise bad_request(f"tool_choice names a function not in 'tools': {name!r}", "tool_choice")
    schema = by_name[name].get("parameters") or {"type": "object"}
    _guide(parameters, {"json": schema}, "tools")
    return tools, "named", name


# Tool calls written as json.dumps writes them (free whitespace would let a model wander).
_CALL_STYLE = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


def _required_call(tools: list[Any], parser: Parser, parameters: dict[str, Any]) -> None:
    """tool_choice "required": a grammar (llguidance Lark with embedded JSON schemas) that
    lets the reply be only tool calls in the parser's format, one of the given functions each."""
    if "guided_decoding" in parameters:
        raise bad_request(
            "tool_choice 'required' cannot be combined with a 'response_format'", "tool_choice"
        )
    arguments = "parameters" if parser.name == "llama3_json" else "arguments"
    options = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t["function"]["name"]},
                arguments: t["function"].get("parameters") or {"type": "object"},
            },
            "required": ["name", arguments],
            "additionalProperties": False,
        }
        for t in tools
    ]
    call: dict[str, Any] = {"x-guidance": _CALL_STYLE, "anyOf": options}
    if parser.name == "mistral":
        schema = {"x-guidance": _CALL_STYLE, "type": "array", "items": call, "minItems": 1}
        lark = f"start: {json.dumps(parser.marker)} calls\ncalls: %json {json.dumps(schema)}"
    elif parser.name == "hermes":
        lark = f'start: "<tool_call>" call "</tool_call>"\ncall: %json {json.dumps(call)}'
    else:  # llama3_json: the reply is the call's JSON
        lark = f"start: call\ncall: %json {json.dumps(call)}"
    if importlib.util.find_spec("llguidance") is not None:  # a schema it cannot compile: 400
        import llguidance

        matcher = llguidance.LLMatcher
        try:
            error = matcher.validate_grammar(matcher.grammar_from_lark(lark))
        except Exception as exc:
            error = str(exc)
        if error:
            raise bad_request(f"the tools' parameters cannot be compiled: {error}", "tools")
    parameters["guided_decoding"] = json.dumps({"grammar": lark})


def chat_plan(
    body: dict[str, Any], tokenizer: ModelTokenizer, parser: Parser | None, typed: bool = False
) -> Plan:
    n, stream, include_usage = _common(body)
    messages = _messages(body)
    asked = sampling.positive_int(body, "max_completion_tokens")
    if asked is None:
        asked = sampling.positive_int(body, "max_tokens")
    logprobs = body.get("logprobs")
    top = sampling.positive_int(body, "top_logprobs", 0)
    if top is not None and top > 20:
        raise bad_request("'top_logprobs' must be at most 20", "top_logprobs")
    if top is not None and not logprobs:
        raise bad_request("'top_logprobs' needs 'logprobs' to be true", "top_logprobs")
    parameters = sampling.sampling_parameters(body, None, tokenizer.vocab_size)
    if logprobs:
        parameters["logprobs"] = top or 0
    _response_format(body, parameters)
    tools, mode, named = _tools(body, parameters)
    if mode == "required" and parser is not None and tools:
        _required_call(tools, parser, parameters)  # without a known format: not enforced
    text = tokenizer.render_chat(messages, tools)
    # As vLLM's chat path: the template writes the special tokens it wants (a BOS), so none
    # are added (with them, a template that writes its BOS got a second one).
    ids = tokenizer.encode(text, add_special_tokens=False)
    count = len(ids)
    prompt = Prompt(text, count, _room(count, asked, tokenizer.context_length, "messages"), ids)
    return Plan(
        chat=True,
        model=body["model"],
        prompts=[prompt],
        parameters=parameters,
        n=n,
        stream=stream,
        include_usage=include_usage,
        logprobs=(top or 0) if logprobs else None,
        parser=parser if mode in ("auto", "required") else None,
        named_tool=named,
        typed=typed,
        id=f"chatcmpl-{uuid.uuid4().hex}",
    )


def _prompts(
    body: dict[str, Any], tokenizer: ModelTokenizer | None
) -> list[tuple[str, list[int] | None]]:
    """(text, token ids) of each prompt: strings, a list of strings, token ids, lists of ids.
    A text prompt gets the tokenizer's special tokens (a BOS), as vLLM's completions do."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        items: list[Any] = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
        items = [prompt]
    elif isinstance(prompt, list) and prompt:
        items = prompt
    else:
        raise bad_request("'prompt' must be a string, a list of strings or token ids", "prompt")
    found = []
    for item in items:
        if isinstance(item, str):
            found.append((item, tokenizer.encode(item) if tokenizer else None))
        elif (
            isinstance(item, list)
            and item
            and all(isinstance(t, int) and not isinstance(t, bool) for t in item)
        ):
            if tokenizer is None:
                raise bad_request("token id prompts need the model's tokenizer", "prompt")
            found.append((tokenizer.decode(item), list(item)))
        else:
            raise bad_request("'prompt' must be a string, a list of strings or token ids", "prompt")
    return found


def completion_plan(
    body: dict[str, Any], tokenizer: ModelTokenizer | None, typed: bool = False
) -> Plan:
    n, stream, include_usage = _common(body)
    if body.get("suffix") is not None:
        raise bad_request("'suffix' is not supported", "suffix")
    best_of = body.get("best_of")
    if best_of is not None and best_of != n:
        raise bad_request("'best_of' is not supported (other than equal to 'n')", "best_of")
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise bad_request("'echo' must be a boolean", "echo")
    asked = sampling.positive_int(body, "max_tokens")
    top = sampling.positive_int(body, "logprobs", 0)
    if top is not None and top > 5:
        raise bad_request("'logprobs' must be at most 5", "logprobs")
    parameters = sampling.sampling_parameters(
        body, None, tokenizer.vocab_size if tokenizer else None
    )
    if top is not None:
        parameters["logprobs"] = top
    _response_format(body, parameters)
    context = tokenizer.context_length if tokenizer else None
    prompts = []
    for text, ids in _prompts(body, tokenizer):
        count = len(ids) if ids is not None else None
        prompts.append(Prompt(text, count, _room(count, asked, context, "prompt"), ids))
    return Plan(
        chat=False,
        model=body["model"],
        prompts=prompts,
        parameters=parameters,
        n=n,
        stream=stream,
        include_usage=include_usage,
        echo=echo,
        logprobs=top,
        typed=typed and tokenizer is not None,
        id=f"cmpl-{uuid.uuid4().hex}",
    )
