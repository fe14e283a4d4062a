"""The OpenAI request bodies as schemas (pydantic, as vLLM's protocol.py and Triton's OpenAI
frontend declare them): types and ranges are checked in one pass over the JSON, and a mistake
is a 400 in OpenAI's shape naming the field (`param`), before anything is tokenized or queued.

Strict: a number sent as a string, or a boolean as a number, is refused as OpenAI refuses it.
Fields OpenAI defines that change nothing here (user, store, metadata, ...) and vLLM's own
extensions (top_k, min_p, repetition_penalty, min_tokens, ignore_eos) are accepted."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from oceanus.frontends.openai.errors import OpenAIError, bad_request

MAX_N = 16

Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
PositiveInt = Annotated[int, Field(ge=1)]


class Schema(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", frozen=True)


class StreamOptions(Schema):
    include_usage: bool = False


class ResponseFormat(Schema):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class _Generation(Schema):
    """What chat and completions share: the sampling parameters (vLLM's names)."""

    model: Annotated[str, Field(min_length=1)]
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: PositiveInt | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    seed: int | None = None
    stop: str | Annotated[list[str], Field(max_length=16)] | None = None
    logit_bias: dict[str, float] | None = None  # ids and range: sampling.logit_bias
    response_format: ResponseFormat | None = None
    # vLLM's extensions to OpenAI's requests, passed to the engine as they are
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: Annotated[int, Field(ge=0)] | None = None
    ignore_eos: bool | None = None
    # vLLM's: the prompt tokens' logprobs with this many alternatives (not streamed)
    prompt_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None

    def sampling(self) -> dict[str, Any]:
        """The sampling parameters that were given, by vLLM's names (max_tokens, logprobs,
        logit_bias and guided decoding are the plan's to set)."""
        names = (
            "temperature",
            "top_p",
            "presence_penalty",
            "frequency_penalty",
            "seed",
            "top_k",
            "min_p",
            "repetition_penalty",
            "min_tokens",
            "ignore_eos",
        )
        parameters = {k: v for k in names if (v := getattr(self, k)) is not None}
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        if stop:
            parameters["stop"] = list(stop)
        return parameters

    def include_usage(self) -> bool:
        if self.stream_options is not None and not self.stream:
            raise bad_request(
                "'stream_options' is only allowed when 'stream' is true", "stream_options"
            )
        if self.stream and self.prompt_logprobs:  # vLLM's rule and words
            raise bad_request(
                "`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs"
            )
        return self.stream_options is not None and self.stream_options.include_usage


class TextPart(Schema):
    type: Literal["text"]
    text: str = ""


class Message(Schema):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[dict[str, Any]] | None = None


class Function(Schema):
    name: Annotated[str, Field(min_length=1)]
    parameters: dict[str, Any] | None = None


class Tool(Schema):
    type: Literal["function"] = "function"
    function: Function


class NamedFunction(Schema):
    name: str


class NamedToolChoice(Schema):
    type: Literal["function"] = "function"
    function: NamedFunction


class ChatCompletionRequest(_Generation):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None


TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


class CompletionRequest(_Generation):
    prompt: str | TokenIds | Annotated[list[str | TokenIds], Field(min_length=1)]
    echo: bool = False
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None  # vLLM's limit (OpenAI's: 5)
    best_of: PositiveInt | None = None
    suffix: str | None = None


class EmbeddingRequest(Schema):
    model: Annotated[str, Field(min_length=1)]
    input: str | TokenIds | Annotated[list[str | TokenIds], Field(min_length=1)]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: PositiveInt | None = None


Body = TypeVar("Body", bound=BaseModel)


def parse(schema: type[Body], data: bytes) -> Body:
    """The body checked against its schema; the first mistake as OpenAI's 400, naming its
    top-level field as `param`."""
    try:
        return schema.model_validate_json(data)
    except ValidationError as exc:
        raise _as_openai(exc) from None


def _as_openai(exc: ValidationError) -> OpenAIError:
    errors = exc.errors(include_url=False, include_context=False, include_input=False)
    # Of a union's failed branches, the deepest says most ("...content.0.type: 'text'" rather
    # than "content: a valid string"); max() keeps the first of equals.
    error = max(errors, key=lambda e: len(e["loc"]))
    location = [str(part) for part in error["loc"]]
    if error["type"] == "json_invalid":
        return bad_request(f"the body is not valid JSON: {error['msg']}")
    if not location:
        return bad_request(f"the body must be a JSON object: {error['msg']}")
    field = ".".join(p for p in location if not _type_tag(p))
    return bad_request(f"'{field}': {error['msg']}", location[0])


def _type_tag(part: str) -> bool:
    """A union branch's name in an error's location (str, list[int], NamedToolChoice): noise to
    a client, who reads the path of fields and indices."""
    if part in ("str", "int", "float", "bool") or part[:1].isupper():
        return True
    return not (part.isidentifier() or part.isdigit())
