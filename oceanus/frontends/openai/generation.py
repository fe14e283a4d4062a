"""A plan's requests run through the core, and their responses as OpenAI's documents: one
reply, or server-sent events ending in `data: [DONE]`.

Each (prompt, n) pair is one core request; their responses are merged as they come. Leaving
the iteration early (a client that cut its stream, or left before its reply) cancels every
request still running: the engine frees their places at its next step.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from oceanus.core.generation import PromptLogprob
from oceanus.core.types import InferRequest, InferResponse
from oceanus.frontends.openai import results, sampling, tools
from oceanus.frontends.openai.plans import Plan
from oceanus.frontends.openai.reasoning import ReasoningStream
from oceanus.frontends.openai.results import Piece

_DONE = object()


class Streams(Protocol):
    """What runs a plan's requests: the core (ServerCore), or a frontend worker's link to it."""

    def infer_stream(self, request: InferRequest) -> AsyncIterator[InferResponse]: ...


async def merged(core: Streams, plan: Plan) -> AsyncGenerator[tuple[int, Piece], None]:
    """(choice index, piece) of every response of the plan's requests, as they come."""
    whole = results.WholeCharacters()
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    streams = []
    for p, prompt in enumerate(plan.prompts):
        for j in range(plan.n):
            parameters = dict(plan.parameters)
            if prompt.max_tokens is not None:
                parameters["max_tokens"] = prompt.max_tokens
            if j and "seed" in parameters:  # n different choices, each still reproducible
                parameters["seed"] += j
            request_id = f"{plan.id}-{p * plan.n + j}"
            logprobs = plan.logprobs is not None
            model = plan.base or plan.model
            if plan.typed and prompt.ids is not None:
                request = sampling.typed_request(
                    model, "", prompt.ids, plan.stream, parameters, logprobs, request_id
                )
            else:
                request = sampling.generate_request(
                    model, "", prompt.text, plan.stream, parameters, logprobs, request_id
                )
            streams.append((p * plan.n + j, core.infer_stream(request)))

    if len(streams) == 1:  # the usual case: no queue, no task, one hop less per response
        index, responses = streams[0]
        try:
            async for response in responses:
                yield index, whole(index, results.read(response))
        finally:
            await responses.aclose()  # type: ignore[attr-defined]
        return

    async def pump(index: int, responses: AsyncIterator[InferResponse]) -> None:
        try:
            async for response in responses:
                await queue.put((index, response))
            await queue.put((index, _DONE))
        except Exception as exc:
            await queue.put((index, exc))
        finally:
            await responses.aclose()  # type: ignore[attr-defined]

    tasks = [asyncio.ensure_future(pump(index, responses)) for index, responses in streams]
    try:
        left = len(tasks)
        while left:
            index, item = await queue.get()
            if item is _DONE:
                left -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, whole(index, results.read(item))
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*tasks, return_exceptions=True)


@dataclass
class Choice:
    text: str = ""
    finish_reason: str | None = None
    input_tokens: int | None = None
    output_tokens: int = 0
    counted: bool = False  # the model reported its output tokens
    logprobs: list[list[tuple[str, float]]] = field(default_factory=list)
    prompt_logprobs: list[list[PromptLogprob]] | None = None

    def add(self, piece: Piece) -> None:
        self.text += piece.text
        self.finish_reason = piece.finish_reason or self.finish_reason
        if piece.input_tokens is not None:
            self.input_tokens = piece.input_tokens
        if piece.output_tokens is not None:
            self.output_tokens += piece.output_tokens
            self.counted = True
        self.logprobs.extend(piece.logprobs)
        if piece.prompt_logprobs is not None:
            self.prompt_logprobs = piece.prompt_logprobs


def _usage(plan: Plan, choices: list[Choice], count: Any) -> dict[str, int]:
    """Prompt tokens once per prompt (not per n), as the model counted them, else as our
    tokenizer did; completion tokens the same way."""
    prompt_tokens = 0
    for p, prompt in enumerate(plan.prompts):
        reported = choices[p * plan.n].input_tokens
        prompt_tokens += reported if reported is not None else (prompt.tokens or 0)
    completion_tokens = sum(c.output_tokens if c.counted else count(c.text) for c in choices)
    return results.usage(prompt_tokens, completion_tokens)


def _chat_message(plan: Plan, choice: Choice) -> tuple[dict[str, Any], str | None]:
    text: str | None = choice.text
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if plan.reasoning is not None:
        thought, text = plan.reasoning.split(choice.text)
        # vLLM 0.32 writes `reasoning`; earlier vLLMs (and their clients) `reasoning_content`.
        message.update(content=text, reasoning=thought, reasoning_content=thought)
    finish = choice.finish_reason
    calls: list[tools.ToolCall] = []
    if text is None:
        pass  # the reply ended in its reasoning
    elif plan.named_tool is not None:
        calls = [tools.named_call(plan.named_tool, text)]
        message["content"] = None
    elif plan.parser is not None:
        content, calls = plan.parser.parse(text)
        if calls:
            message["content"] = content
    if calls:
        message["tool_calls"] = [call.document() for call in calls]
        finish = "tool_calls" if finish == "stop" else finish
    return message, finish


async def complete(core: Streams, plan: Plan, count: Any) -> dict[str, Any]:
    """The whole reply of a non-streaming request."""
    choices = [Choice() for _ in range(len(plan.prompts) * plan.n)]
    async with contextlib.aclosing(merged(core, plan)) as pieces:
        async for index, piece in pieces:
            choices[index].add(piece)
    usage = _usage(plan, choices, count)  # best_of: every generated choice counts, as OpenAI's
    documents = []
    for index, (number, choice) in enumerate(_kept(plan, choices)):
        if plan.chat:
            message, finish = _chat_message(plan, choice)
            logprobs = (
                results.chat_logprobs(choice.logprobs, plan.logprobs)
                if plan.logprobs is not None
                else None
            )
            documents.append(
                {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish}
            )
            continue
        prompt = plan.prompts[number // plan.n].text if plan.echo else ""
        logprobs = (
            _completion_logprobs(plan, choice, prompt)
            if plan.logprobs is not None and plan.show_logprobs
            else None
        )
        document: dict[str, Any] = {
            "index": index,
            "text": prompt + choice.text,
            "logprobs": logprobs,
            "finish_reason": choice.finish_reason,
        }
        if plan.prompt_logprobs is not None:  # vLLM's field, per choice in completions
            document["prompt_logprobs"] = results.prompt_logprobs(
                choice.prompt_logprobs, plan.prompt_logprobs
            )
        documents.append(document)
    reply: dict[str, Any] = {
        "id": plan.id,
        "object": "chat.completion" if plan.chat else "text_completion",
        "created": plan.created,
        "model": plan.model,
        "choices": documents,
        "usage": usage,
    }
    if plan.chat and plan.prompt_logprobs is not None:  # vLLM's field, once in chat's reply
        reply["prompt_logprobs"] = results.prompt_logprobs(
            choices[0].prompt_logprobs, plan.prompt_logprobs
        )
    return reply


def _completion_logprobs(
    plan: Plan, choice: Choice, prompt: str, offset: int = 0
) -> dict[str, Any]:
    """Completions' logprobs of a choice's tokens (or of its latest piece's), with an echoed
    prompt's first when the engine computed them (the first prompt token's logprob null, as
    OpenAI's and vLLM's); a model that has none for the prompt leaves its tokens out."""
    steps: results.Steps = [[*step] for step in choice.logprobs]
    if prompt and choice.prompt_logprobs is not None and plan.logprobs is not None:
        steps = results.prompt_steps(choice.prompt_logprobs, plan.logprobs) + steps
    elif prompt:
        offset = len(prompt)
    return results.completion_logprobs(steps, offset)


def _kept(plan: Plan, choices: list[Choice]) -> list[tuple[int, Choice]]:
    """(number, choice) of the choices the reply shows: all, or with `best_of` the `keep`
    likeliest of each prompt's (the highest sum of their tokens' logprobs), as vLLM's."""
    numbered = list(enumerate(choices))
    if plan.keep is None:
        return numbered
    kept = []
    for start in range(0, len(numbered), plan.n):
        group = numbered[start : start + plan.n]
        group.sort(key=lambda item: -sum(step[0][1] for step in item[1].logprobs if step))
        kept += group[: plan.keep]
    return kept


def event(document: Any) -> bytes:
    return b"data: " + orjson.dumps(document) + b"\n\n"


DONE_EVENT = b"data: [DONE]\n\n"


class _ChatStream:
    """What a streaming chat choice has sent; text that may be a tool call is held back."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.text = ""
        self.sent = 0
        self.in_call = False

    def content(self, final: bool) -> str:
        """New text that is the reply's content (not a tool call), to send now."""
        parser = self.plan.parser
        if self.plan.named_tool is not None:
            return ""
        if parser is None:
            delta, self.sent = self.text[self.sent :], len(self.text)
            return delta
        if not self.in_call:
            start = parser.start(self.text)
            if start >= 0:
                self.in_call = True
                delta, self.sent = self.text[self.sent : start], start
                return delta
            keep = 0 if final else parser.hold(self.text)
            end = len(self.text) - keep
            delta, self.sent = self.text[self.sent : end], max(end, self.sent)
            return delta
        return ""

    def calls(self) -> tuple[list[tools.ToolCall], str]:
        """At the end: the tool calls, and any held text that was not one after all."""
        held = self.text[self.sent :]
        if self.plan.named_tool is not None:
            return [tools.named_call(self.plan.named_tool, self.text)], ""
        if self.plan.parser is None or not self.in_call:
            return [], held
        _, calls = self.plan.parser.parse(self.text)
        return (calls, "") if calls else ([], held)


async def stream_events(core: Streams, plan: Plan, count: Any) -> AsyncGenerator[bytes, None]:
    """The server-sent events of a streaming request (after its 200 head)."""
    async with contextlib.aclosing(chunks(core, plan, count)) as documents:
        async for document in documents:
            yield event(document)
    yield DONE_EVENT


async def _prepend(
    first: tuple[int, Piece] | None, rest: AsyncIterator[tuple[int, Piece]]
) -> AsyncIterator[tuple[int, Piece]]:
    if first is not None:
        yield first
    async for item in rest:
        yield item


async def chunks(core: Streams, plan: Plan, count: Any) -> AsyncGenerator[dict[str, Any], None]:
    """The chunks of a streaming request, as documents. Nothing comes before the model's first
    response: a request the engine refuses (the OpenVINO engine checks at its first step) is
    then an error reply before the stream's 200 head, not an error event inside it."""
    kind = "chat.completion.chunk" if plan.chat else "text_completion"
    total = len(plan.prompts) * plan.n
    head: dict[str, Any] = {"id": plan.id, "object": kind, "created": plan.created}
    head["model"] = plan.model
    usage_field = {"usage": None} if plan.include_usage else {}

    def chunk(
        index: int, body: dict[str, Any], finish: str | None = None, logprobs: Any = None
    ) -> dict[str, Any]:
        choice = {"index": index, **body, "logprobs": logprobs, "finish_reason": finish}
        return {**head, "choices": [choice], **usage_field}

    choices = [Choice() for _ in range(total)]
    offsets = [0] * total  # completions' text_offset so far, per choice
    echoed = [not plan.echo] * total
    chats = [_ChatStream(plan) for _ in range(total)]
    thinking = [ReasoningStream(plan.reasoning) for _ in range(total)] if plan.reasoning else []
    async with contextlib.aclosing(merged(core, plan)) as pieces:
        first = await anext(pieces, None)
        if plan.chat:
            for index in range(total):
                yield chunk(index, {"delta": {"role": "assistant", "content": ""}})
        async for index, piece in _prepend(first, pieces):
            choice = choices[index]
            choice.add(piece)
            final = piece.finish_reason is not None
            if not plan.chat:
                # An echoed prompt comes with the choice's first text, as vLLM sends it.
                prompt = "" if echoed[index] else plan.prompts[index // plan.n].text
                echoed[index] = True
                logprobs = None
                if plan.logprobs is not None and (piece.logprobs or prompt):
                    latest = Choice(logprobs=piece.logprobs, prompt_logprobs=piece.prompt_logprobs)
                    logprobs = _completion_logprobs(plan, latest, prompt, offsets[index])
                    if logprobs["tokens"]:
                        offsets[index] = logprobs["text_offset"][-1] + len(logprobs["tokens"][-1])
                if prompt or piece.text or final or logprobs:
                    text = prompt + piece.text
                    yield chunk(index, {"text": text}, piece.finish_reason, logprobs)
                continue
            logprobs = None
            if plan.logprobs is not None and piece.logprobs:
                logprobs = results.chat_logprobs(piece.logprobs, plan.logprobs)
            chat = chats[index]
            chat.text = choice.text
            if thinking:  # the reasoning first, then the content after it
                thought, chat.text = thinking[index].feed(choice.text, final)
                if thought:
                    delta_thought = {"reasoning": thought, "reasoning_content": thought}
                    yield chunk(index, {"delta": delta_thought})
            delta = chat.content(final)
            if delta or logprobs:
                yield chunk(index, {"delta": {"content": delta}}, None, logprobs)
            if final:
                finish = piece.finish_reason
                calls, held = chat.calls()
                if held:
                    yield chunk(index, {"delta": {"content": held}})
                if calls:
                    documents = [call.document(number) for number, call in enumerate(calls)]
                    yield chunk(index, {"delta": {"tool_calls": documents}})
                    finish = "tool_calls" if finish == "stop" else finish
                yield chunk(index, {"delta": {}}, finish)
    if plan.include_usage:
        yield {**head, "choices": [], "usage": _usage(plan, choices, count)}
