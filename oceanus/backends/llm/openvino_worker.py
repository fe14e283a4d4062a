"""The OpenVINO engine's own process: OpenVINO GenAI's continuous-batching pipeline and its
step loop, driven over an `oceanus.ipc` channel by openvino_engine.py in the server.

Why a process: the pipeline's `step()` binding holds the GIL for the whole step (tens of ms),
so in the server's process it would stall the event loop and every other model's thread. Here
it holds nothing of the server's. What crosses the channel is small: token ids in, and per
step, each live request's new token ids and their log probabilities out.

    python -m oceanus.backends.llm.openvino_worker FD
"""

from __future__ import annotations

import json
import socket
import sys
import traceback
from pathlib import Path
from typing import Any, NamedTuple

from oceanus.ipc.channel import Channel, MessageKinds


class Start(NamedTuple):
    model: str  # the Hugging Face folder (traced to OpenVINO on first use)
    scheduler: dict[str, Any]  # SchedulerConfig fields
    properties: dict[str, Any]  # the CPU plugin's (precision, threads)
    quantization: str = ""  # model.json's: "", "int8" or "int4" (weight compression)
    tokenizer: str = ""  # the Hugging Face tokenizer folder (converted for structured output)
    trust_remote_code: bool = False
    kind: int = 1


class Ready(NamedTuple):
    error: str  # "" when the pipeline is up
    ir_dir: str
    export_s: float  # seconds spent tracing the model (0: it was cached)
    # Why structured output is off ("" when the tokenizer converted and it is on).
    no_guided: str = ""
    kind: int = 2


class Add(NamedTuple):
    rid: int
    prompt: list[int]
    config: dict[str, Any]  # GenerationConfig fields, and "eos" for set_eos_token_id
    kind: int = 3


class Drop(NamedTuple):
    rid: int
    kind: int = 4


class Tokens(NamedTuple):
    """After each step: (rid, new token ids, their log probabilities, end) per live request;
    end is "" while it runs, else the pipeline's reason ("length", "stop", "abort")."""

    items: list[tuple[int, list[int], list[float], str]]
    error: str = ""  # the step failed: every live request ended with it
    # (rid, why) for requests refused before any step (a grammar xgrammar cannot compile, by
    # the grammar check or add_request): only they end.
    refused: tuple[tuple[int, str], ...] = ()
    kind: int = 5


class Stop(NamedTuple):
    kind: int = 6


KINDS = MessageKinds([Start, Ready, Add, Drop, Tokens, Stop])


def _config(genai: Any, fields: dict[str, Any]) -> Any:
    config = genai.GenerationConfig()
    eos = fields.pop("eos", None)
    structured = fields.pop("structured_output", None)
    if structured:
        from oceanus.backends.llm.openvino_grammar import structured_config

        config.structured_output_config = structured_config(genai, structured)
    for name, value in fields.items():
        setattr(config, name, value)
    if eos is not None:
        config.set_eos_token_id(eos)
    return config


def _guided(genai: Any, start: Start, ir_dir: Path) -> tuple[Any, Any, str]:
    """The OpenVINO tokenizer for the pipeline (structured output needs its vocabulary) and the
    grammar check, or None, None and why not: a tokenizer that does not convert leaves the
    engine serving free text."""
    if not start.tokenizer:
        return None, None, "no tokenizer folder was given"
    from oceanus.backends.llm.openvino_export import cached_tokenizer
    from oceanus.backends.llm.openvino_grammar import GrammarCheck

    try:
        folder = cached_tokenizer(Path(start.tokenizer), start.trust_remote_code)
        tokenizer = genai.Tokenizer(str(folder))
        vocab = int(json.loads((ir_dir / "config.json").read_text())["vocab_size"])
        return tokenizer, GrammarCheck(genai, tokenizer, vocab), ""
    except Exception as exc:  # the tokenizer's conversion, or the checker's model
        return None, None, f"structured output could not be set up ({_text(exc)})"


def _text(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


def _reason(value: Any) -> str:
    """GenerationFinishReason -> vLLM's finish reason ("" for NONE)."""
    return {"LENGTH": "length", "STOP": "stop"}.get(str(value).rsplit(".", 1)[-1], "")


def serve(channel: Channel) -> None:
    start = channel.recv()
    try:
        import numpy as np
        import openvino as ov
        import openvino_genai as genai

        from oceanus.backends.llm.openvino_export import cached_ir

        ir_dir, export_s = cached_ir(Path(start.model), start.quantization or None)
        scheduler = genai.SchedulerConfig()
        for name, value in start.scheduler.items():
            setattr(scheduler, name, value)
        tokenizer, check, no_guided = _guided(genai, start, ir_dir)
        if tokenizer is None:
            pipe = genai.ContinuousBatchingPipeline(str(ir_dir), scheduler, "CPU", start.properties)
        else:
            pipe = genai.ContinuousBatchingPipeline(
                str(ir_dir), tokenizer, scheduler, "CPU", **start.properties
            )
    except Exception as exc:
        channel.send(Ready(_text(exc), "", 0.0))
        return
    channel.send(Ready("", str(ir_dir), export_s, no_guided))
    running = genai.GenerationStatus.RUNNING
    live: dict[int, Any] = {}
    while True:
        message = channel.recv(None if not live else 0)
        refused: list[tuple[int, str]] = []
        while message is not None:
            if isinstance(message, Stop):
                return
            if isinstance(message, Add):
                ids = ov.Tensor(np.array([message.prompt], dtype=np.int64))
                structured = message.config.get("structured_output")
                why = ""
                if structured:  # never unchecked: a bad grammar would break the pipeline
                    why = check.error(structured) if check else no_guided
                try:
                    if not why:
                        config = _config(genai, dict(message.config))
                        live[message.rid] = pipe.add_request(message.rid, ids, config)
                except Exception as exc:
                    why = _text(exc)
                if why:  # a grammar xgrammar cannot compile: this request alone
                    refused.append((message.rid, why))
            elif isinstance(message, Drop) and message.rid in live:
                live.pop(message.rid).cancel()
            message = channel.recv(0)
        if not live:
            if refused:
                channel.send(Tokens([], refused=tuple(refused)))
            continue
        try:
            pipe.step()
        except Exception as exc:
            channel.send(Tokens([(rid, [], [], "abort") for rid in live], f"{exc}"))
            live.clear()
            continue
        items: list[tuple[int, list[int], list[float], str]] = []
        for rid, handle in list(live.items()):
            ids_out: list[int] = []
            logprobs: list[float] = []
            end = ""
            while handle.can_read():
                for output in handle.read().values():
                    ids_out += output.generated_ids
                    logprobs += output.generated_log_probs
                    end = _reason(output.finish_reason) or end
            if handle.get_status() != running:
                end = end or "abort"
                del live[rid]
            items.append((rid, ids_out, logprobs, end))
        channel.send(Tokens(items, refused=tuple(refused)))


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    channel = Channel(sock, KINDS)
    try:
        serve(channel)
    except EOFError:
        pass  # the server went away: nothing left to answer
    finally:
        channel.close()


if __name__ == "__main__":
    main()
