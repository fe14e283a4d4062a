"""Chat and completion requests (checked by protocol.py's schemas) -> a `Plan`: the prompts
(rendered and tokenized once with the model's tokenizer), the sampling parameters, and how the
reply is read back (echo, logprobs, tool calls). Every mistake is a 400 that names its field,
before anything is queued."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from oceanus.frontends.openai import sampling
from oceanus.frontends.openai.errors import OpenAIError, bad_request
from oceanus.frontends.openai.protocol import (
    MAX_N,
    ChatCompletionRequest,
    CompletionRequest,
    Message,
    NamedToolChoice,
    ResponseFormat,
)
from oceanus.frontends.openai.reasoning import ReasoningParser
from oceanus.frontends.openai.tokenizer import ModelTokenizer
from oceanus.frontends.openai.tools import Parser

COMPLETION_MAX_TOKENS = 16


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
    # best_of: `n` is how many are generated per prompt, `keep` how many the reply shows (the
    # likeliest, by their logprobs, which the client may not have asked to see).
    keep: int | None = None
    show_logprobs: bool = True
    # vLLM's `prompt_logprobs` field shown with this many alternatives (None: not shown).
    prompt_logprobs: int | None = None
    parser: Parser | None = None  # tool calls are parsed from the reply
    named_tool: str | None = None  # tool_choice named this function
    reasoning: ReasoningParser | None = None  # thinking is set apart (reasoning.py)
    # The model is the built-in engine: its requests carry the prompts' ids and typed sampling
    # parameters (core.generation) instead of the vLLM backend's tensors.
    typed: bool = False
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    # The model the requests go to when `model` (what the reply names) is a LoRA adapter of
    # it ("": `model` itself); the adapter then rides in the parameters' `lora_name`.
    base: str = ""


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


def _response_format(response_format: ResponseFormat | None, parameters: dict[str, Any]) -> None:
    if response_format is None or response_format.type == "text":
        return
    if response_format.type == "json_object":
        _guide(parameters, {"json_object": True}, "response_format")
        return
    spec = response_format.json_schema or {}
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise bad_request(
            "'response_format.json_schema.schema' must be an object", "response_format"
        )
    _guide(parameters, {"json": schema}, "response_format")


def template_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """The messages as the template reads them (dicts, with any fields the client added)."""
    shown = []
    for number, message in enumerate(messages):
        item = message.model_dump(exclude_none=True)
        if message.content is None:
            if message.role != "assistant" or not message.tool_calls:
                # OpenAI's words and param for a message without content (an assistant's may
                # go without when it carries tool calls: the openai SDK sends those back so).
                raise OpenAIError(
                    400,
                    f"Missing required parameter: 'messages[{number}].content'.",
                    f"messages.[{number}].content",
                    "missing_required_parameter",
                )
            item["content"] = ""  # templates concatenate it, as vLLM renders it
        if message.role == "developer":  # OpenAI's newer name; templates know "system"
            item["role"] = "system"
        if isinstance(message.content, list):
            item["content"] = "".join(part.text for part in message.content)
        for call in item.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                # templates write the arguments as an object, as transformers passes them
                with contextlib.suppress(ValueError):
                    function["arguments"] = json.loads(function["arguments"])
        shown.append(item)
    return shown


def _tools(
    body: ChatCompletionRequest, parameters: dict[str, Any]
) -> tuple[list[Any] | None, str, str | None]:
    """(the tools for the template, the tool_choice mode, the named function)."""
    choice = body.tool_choice
    if body.tools is None:
        if choice not in (None, "none"):
            raise bad_request("'tool_choice' needs 'tools'", "tool_choice")
        return None, "none", None
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools]
    if choice is None:
        choice = "auto"
    if choice == "none":
        return None, "none", None
    if not isinstance(choice, NamedToolChoice):
        return tools, choice, None
    name = choice.function.name
    by_name = {t["function"]["name"]: t["function"] for t in tools}
    if name not in by_name:
        raise bad_request(f"tool_choice names a function not in 'tools': {name!r}", "tool_choice")
    schema = by_name[name].get("parameters") or {"type": "object"}
    _guide(parameters, {"json": schema}, "tools")
    return tools, "named", name


# Tool calls written as json.dumps writes them (free whitespace would let a model wander).
_CALL_STYLE = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


def _required_call(tools: list[Any], parser: Parser, parameters: dict[str, Any]) -> None:
    """tool_choice "required": the reply is only tool calls in the parser's format, one of the
    given functions each: guided decoding's `tagged_json` (a JSON schema between the parser's
    markers), which both LLM engines read (the transformers engine as a Lark grammar, the
    openvino engine as GenAI's compound grammar)."""
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
        tagged = {"begin": parser.marker, "schema": schema, "end": ""}
    elif parser.name == "hermes":
        tagged = {"begin": "<tool_call>", "schema": call, "end": "</tool_call>"}
    else:  # llama3_json: the reply is the call's JSON
        tagged = {"begin": "", "schema": call, "end": ""}
    if importlib.util.find_spec("llguidance") is not None:  # a schema it cannot compile: 400
        import llguidance

        matcher = llguidance.LLMatcher
        try:
            error = matcher.validate_grammar(
                matcher.grammar_from_json_schema(json.dumps(tagged["schema"]))
            )
        except Exception as exc:
            error = str(exc)
        if error:
            raise bad_request(f"the tools' parameters cannot be compiled: {error}", "tools")
    parameters["guided_decoding"] = json.dumps({"tagged_json": tagged})


def chat_plan(
    body: ChatCompletionRequest,
    tokenizer: ModelTokenizer,
    parser: Parser | None,
    typed: bool = False,
    reasoning: ReasoningParser | None = None,
) -> Plan:
    include_usage = body.include_usage()
    messages = template_messages(body.messages)
    asked = body.max_completion_tokens or body.max_tokens
    top = body.top_logprobs
    if top is not None and not body.logprobs:
        raise bad_request("'top_logprobs' needs 'logprobs' to be true", "top_logprobs")
    parameters = _parameters(body, tokenizer)
    if body.logprobs:
        parameters["logprobs"] = top or 0
    _prompt_logprobs(parameters, typed, body.prompt_logprobs)
    _response_format(body.response_format, parameters)
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
        model=body.model,
        prompts=[prompt],
        parameters=parameters,
        n=body.n,
        stream=body.stream,
        include_usage=include_usage,
        logprobs=(top or 0) if body.logprobs else None,
        parser=parser if mode in ("auto", "required") else None,
        named_tool=named,
        reasoning=reasoning,
        typed=typed,
        prompt_logprobs=body.prompt_logprobs if typed else None,
        id=f"chatcmpl-{uuid.uuid4().hex}",
    )


def _prompt_logprobs(parameters: dict[str, Any], typed: bool, *asks: int | None) -> None:
    """The engine computes the prompt's logprobs only when a request needs them (echo with
    logprobs, vLLM's `prompt_logprobs`), with the most alternatives any of them shows. Models
    other than the built-in engine (model.py, ensembles) have no such output."""
    wanted = [ask for ask in asks if ask is not None]
    if typed and wanted:
        parameters["prompt_logprobs"] = max(wanted)


def _parameters(
    body: ChatCompletionRequest | CompletionRequest, tokenizer: ModelTokenizer | None
) -> dict[str, Any]:
    parameters = body.sampling()
    bias = sampling.logit_bias(body.logit_bias, tokenizer.vocab_size if tokenizer else None)
    if bias:
        parameters["logit_bias"] = bias
    return parameters


def _prompts(
    body: CompletionRequest, tokenizer: ModelTokenizer | None
) -> list[tuple[str, list[int] | None]]:
    """(text, token ids) of each prompt: strings, a list of strings, token ids, lists of ids.
    A text prompt gets the tokenizer's special tokens (a BOS), as vLLM's completions do."""
    prompt: Any = body.prompt  # str | ids | list[str | ids]: narrowed by its first item
    one = isinstance(prompt, str) or isinstance(prompt[0], int)  # text, or token ids
    items: list[str | list[int]] = [prompt] if one else list(prompt)
    found: list[tuple[str, list[int] | None]] = []
    for item in items:
        if isinstance(item, str):
            found.append((item, tokenizer.encode(item) if tokenizer else None))
        else:
            if tokenizer is None:
                raise bad_request("token id prompts need the model's tokenizer", "prompt")
            outside = [token for token in item if token >= tokenizer.vocab_size]
            if outside:  # vLLM's words; the engine would fail on it
                raise bad_request(f"Token id {outside[0]} is out of vocabulary", "prompt")
            found.append((tokenizer.decode(item), list(item)))
    return found


def completion_plan(
    body: CompletionRequest, tokenizer: ModelTokenizer | None, typed: bool = False
) -> Plan:
    include_usage = body.include_usage()
    if body.suffix is not None:
        raise bad_request("'suffix' is not supported", "suffix")
    best_of = body.best_of if body.best_of is not None and body.best_of != body.n else None
    if best_of is not None:  # vLLM's rules
        if best_of < body.n:
            raise bad_request("'best_of' must be at least 'n'", "best_of")
        if best_of > MAX_N:
            raise bad_request(f"'best_of' must be at most {MAX_N}", "best_of")
        if body.stream:
            raise bad_request("'best_of' greater than 'n' cannot be streamed", "best_of")
    asked = body.max_tokens
    # OpenAI's and vLLM's default for completions (chat's is what the context leaves).
    default = COMPLETION_MAX_TOKENS if asked is None else None
    top = body.logprobs
    parameters = _parameters(body, tokenizer)
    if best_of is not None and top is None:
        top = 0  # the choices are ranked by their tokens' logprobs
    if top is not None:
        parameters["logprobs"] = top
    typed = typed and tokenizer is not None
    echoed = body.logprobs if body.echo else None
    _prompt_logprobs(parameters, typed, echoed, body.prompt_logprobs)
    _response_format(body.response_format, parameters)
    context = tokenizer.context_length if tokenizer else None
    prompts = []
    for text, ids in _prompts(body, tokenizer):
        count = len(ids) if ids is not None else None
        room = _room(count, asked, context, "prompt")
        if default is not None:
            room = default if room is None else min(default, room)
        prompts.append(Prompt(text, count, room, ids))
    return Plan(
        chat=False,
        model=body.model,
        prompts=prompts,
        parameters=parameters,
        n=best_of or body.n,
        stream=body.stream,
        include_usage=include_usage,
        echo=body.echo,
        logprobs=top,
        keep=body.n if best_of is not None else None,
        show_logprobs=body.logprobs is not None,
        # vLLM shows the field when asked, and with echo's logprobs, which it computed.
        prompt_logprobs=(
            (body.prompt_logprobs if body.prompt_logprobs is not None else echoed)
            if typed
            else None
        ),
        typed=typed,
        id=f"cmpl-{uuid.uuid4().hex}",
    )
