"""What every LLM engine shares: the queue, admission, detokenizing and finishing.

`Scheduler` is the engine's face (`submit`, `wait_for_room`, `close`, the hooks the backend
and the metrics use) and its bookkeeping; a subclass supplies the step that turns the
running sequences into next tokens: engine.py's over transformers and PyTorch, or
openvino_engine.py's over OpenVINO GenAI in a process of its own. One thread runs the loop.
Every step it
1. drops sequences whose reader left (their slot is free at once),
2. admits waiting sequences while a slot is free and the KV-cache token budget holds their
   reservation (prompt + max_tokens, capped at max_model_len); the rest keep waiting,
3. runs the subclass's `_step`, which calls `_advance` with each sequence's next token.

Nothing here imports torch (the OpenVINO engine's parent process needs none)."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from oceanus.backends.llm.args import EngineArgs
from oceanus.backends.llm.memory import human, kv_budget
from oceanus.core.errors import ErrorCode, InferenceServerError, internal, invalid_arg, unavailable
from oceanus.core.generation import SamplingParams

log = logging.getLogger("oceanus.backends.llm")


@dataclass(slots=True)
class StepOutput:
    """What one step produced for one sequence (the callback's argument)."""

    text: str  # the new text since the previous output
    token_ids: list[int]
    logprobs: list[dict[int, float]] | None
    finished: bool
    finish_reason: str | None  # "stop", "length", "abort"
    num_input_tokens: int
    num_output_tokens: int
    cumulative_logprob: float
    error: InferenceServerError | None = None
    # With the first token of a sequence that asked for them: per prompt token after the first,
    # {token id: (logprob, rank)}, the prompt's own token first.
    prompt_logprobs: list[dict[int, tuple[float, int]]] | None = None


@dataclass(eq=False)
class Sequence:
    prompt: list[int]
    params: SamplingParams
    sink: Callable[[StepOutput], None]
    cancelled: Callable[[], bool]
    arrival_ns: int = field(default_factory=time.monotonic_ns)
    slot: int = -1
    reserved: int = 0
    prefilled: int = 0
    generated: list[int] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    text: str = ""  # the text already sent
    first_token_ns: int = 0
    last_token_ns: int = 0
    token_gaps_ns: list[int] = field(default_factory=list)  # between consecutive tokens
    e2e_ns: int = 0
    generator: Any = None  # torch.Generator of a sampled sequence (engine.py)
    finished: bool = False
    guide: Any = None  # guide.Guide: structured output's grammar state (None: free text)
    # Prompt tokens whose KV came from the prefix cache (engine.py); None: not looked up yet.
    cached_tokens: int | None = None
    # Filled by the prefill when the sampling parameters ask for prompt logprobs (engine.py).
    prompt_logprobs: list[dict[int, tuple[float, int]]] = field(default_factory=list)
    # The LoRA adapter's id (lora.py; 0: the base model), held from submit until released.
    lora_id: int = 0
    lora_held: bool = False


@dataclass
class EngineCounters:
    """Read by the backend's metrics (plain ints written by the engine thread)."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    running: int = 0
    waiting: int = 0
    reserved_tokens: int = 0
    budget_tokens: int = 0
    # vLLM's prefix-cache counters, in tokens: prompt tokens looked up, and those found.
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0


# Called when a sequence ends: (sequence, finish reason); and after every step.
FinishHook = Callable[[Sequence, str], None]
StepHook = Callable[["Scheduler"], None]
# Called after every batch of sink calls (a forward pass's outputs, a step's or close's aborts):
# a sink may hold what it was given and pass the whole batch on at once (backend.py does).
FlushHook = Callable[[], None]


class Scheduler:
    """The engine's face and bookkeeping; subclasses implement `_step` (and may wrap `_run`)."""

    thread_name = "llm-engine"

    def __init__(self, args: EngineArgs, tokenizer: Any, config: Any) -> None:
        """`config`: the model's Hugging Face config (max positions, EOS, vocabulary)."""
        self.args = args
        self.tokenizer: Any = tokenizer
        self.max_len = int(args.max_model_len or config.max_position_embeddings)
        self.slots = args.max_num_seqs
        self.max_loras = args.max_loras  # distinct LoRA adapters in one step
        self.chunk = args.max_num_batched_tokens
        # The KV budget (memory.py): bytes from model.json / the environment / the machine, and
        # the tokens they buy, which admission reserves against.
        self.kv = kv_budget(args, config, self.max_len, self.slots)
        self.budget = self.kv.tokens
        self.weights_bytes = 0  # the model's weights, for the load log (set by the subclass)
        eos = config.eos_token_id if config.eos_token_id is not None else None
        self.eos: int | None = eos[0] if isinstance(eos, list) else eos
        self.pad = int(config.pad_token_id if config.pad_token_id is not None else 0)
        self.vocab = int(config.vocab_size)
        self.counters = EngineCounters(budget_tokens=self.budget)
        self.on_finish: FinishHook | None = None
        self.on_step: StepHook | None = None
        self.on_flush: FlushHook | None = None
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []
        self._free = list(range(self.slots - 1, -1, -1))  # pop() gives the lowest slot
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)

    def describe_memory(self) -> str:
        """The load log's memory figures: dtype, weights, KV budget and the tokens it holds."""
        return (
            f"dtype {self.args.dtype} ({self.args.dtype_source}), weights "
            f"{human(self.weights_bytes)}"
            + (f" ({self.args.quantization} weight-only)" if self.args.quantization else "")
            + f", {self.kv.describe()}"
        )

    def _start(self) -> None:
        """Start the step loop (the subclass calls this once it is ready)."""
        self._thread.start()

    # ---- the face ------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    def submit(
        self,
        prompt: list[int],
        params: SamplingParams,
        sink: Callable[[StepOutput], None],
        cancelled: Callable[[], bool] = lambda: False,
        lora_name: str | None = None,
    ) -> Sequence:
        """Queue a sequence; `sink` gets its outputs on the engine thread. Raises INVALID_ARG
        for a prompt that cannot fit, NOT_FOUND for a LoRA adapter not loaded."""
        if not prompt:
            raise invalid_arg("the prompt is empty")
        if max(prompt) >= self.vocab or min(prompt) < 0:  # it would fail the whole batch's step
            bad = next(t for t in prompt if not 0 <= t < self.vocab)
            raise invalid_arg(f"Token id {bad} is out of vocabulary")
        if len(prompt) >= self.max_len:
            raise invalid_arg(
                f"the prompt has {len(prompt)} tokens; this model's max_model_len is "
                f"{self.max_len} and at least one token must be generated"
            )
        seq = Sequence(prompt, params, sink, cancelled)
        seq.reserved = min(len(prompt) + params.max_tokens, self.max_len)
        self._prepare(seq)
        if lora_name:
            seq.lora_id = self._acquire_lora(lora_name)
            seq.lora_held = True
        with self._cond:
            if self._closed:
                self._release_lora(seq)
                raise invalid_arg("the engine is stopping")
            self._waiting.append(seq)
            self.counters.waiting = len(self._waiting)
            self._cond.notify_all()
        return seq

    def wait_for_room(self) -> None:
        """Block while the next step could not admit every submitted sequence (a slot each and
        their KV reservations within the budget): the backend calls this after submitting, so
        that requests beyond the budget wait in the server's queue, while requests that fit
        are submitted at once. (Waiting for the admission itself would let the server hand
        over one request per step: the 32nd of a burst would wait 31 steps to be admitted.)"""
        with self._cond:
            while self._waiting and not self._closed and not self._room_for_waiting():
                self._cond.wait()

    def _room_for_waiting(self) -> bool:
        """Under the lock: whether `_admit` will take every waiting sequence."""
        if len(self._waiting) > len(self._free):
            return False
        adapters = {s.lora_id for s in [*self._running, *self._waiting] if s.lora_id}
        if len(adapters) > self.max_loras:
            return False
        need = sum(s.reserved for s in self._waiting)
        return self.counters.reserved_tokens + need <= self.budget or (
            not self._running and len(self._waiting) == 1
        )

    def _prepare(self, seq: Sequence) -> None:
        """Per-sequence state of the subclass's own (a sampler's generator, a grammar); raises
        INVALID_ARG for what this engine cannot do."""

    def _acquire_lora(self, name: str) -> int:
        """A LoRA adapter's id, held for a sequence (engine.py's; others serve none)."""
        raise invalid_arg(f"LoRA adapters are not supported by the {self.args.engine} engine")

    def lora_activity(self) -> tuple[list[str], list[str]]:
        """The LoRA adapters of the running and of the waiting sequences, by name."""
        return [], []

    def lora_names(self) -> list[str] | None:
        """The LoRA adapters loaded, by name (None: this engine serves none)."""
        return None

    def _release_lora(self, seq: Sequence) -> None:
        """Let go of `seq`'s adapter (once): an unloaded adapter goes when its last user ends."""

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()

    # ---- the step loop -------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._running and not self._waiting:
                    self._cond.wait()
                if self._closed:
                    self._abort_all()
                    self._flush()
                    return
                self._admit()
            try:
                self._step()
                if self.on_step is not None:
                    self.on_step(self)
            except Exception as exc:  # a failed step fails its sequences, not the engine
                log.exception("LLM engine step failed")
                error = internal(f"generation failed: {exc}")
                for seq in list(self._running):
                    self._finish(seq, "abort", error)
            self._flush()

    def _flush(self) -> None:
        if self.on_flush is not None:
            self.on_flush()

    def _admit(self) -> None:
        """Under the lock."""
        for seq in [s for s in self._waiting if s.cancelled()]:
            self._waiting.remove(seq)
            self._release_lora(seq)
        # At most max_loras adapters run in a step: a sequence of another adapter waits (and
        # those behind it may pass), as vLLM's scheduler skips it.
        adapters = {s.lora_id for s in self._running if s.lora_id}
        index = 0
        while index < len(self._waiting) and self._free:
            seq = self._waiting[index]
            if seq.lora_id and seq.lora_id not in adapters and len(adapters) >= self.max_loras:
                index += 1
                continue
            if self.counters.reserved_tokens + seq.reserved > self.budget and self._running:
                break
            del self._waiting[index]
            if seq.lora_id:
                adapters.add(seq.lora_id)
            seq.slot = self._free.pop()
            self.counters.reserved_tokens += seq.reserved
            self._running.append(seq)
        self.counters.waiting = len(self._waiting)
        self.counters.running = len(self._running)
        if not self._waiting:
            self._cond.notify_all()

    def _step(self) -> None:
        """One step over the running sequences (they are admitted): `_advance` each one that
        got a token, `_finish` those that end without one."""
        raise NotImplementedError

    def _advance(
        self, seq: Sequence, token: int, logprob: float, top: dict[int, float] | None
    ) -> None:
        """A sequence's next token: count it, detokenize, end it on EOS, length or a stop
        string, and send its output."""
        params = seq.params
        now = time.monotonic_ns()
        if not seq.generated:
            seq.first_token_ns = now
        else:
            seq.token_gaps_ns.append(now - seq.last_token_ns)
        seq.last_token_ns = now
        seq.generated.append(token)
        seq.cumulative_logprob += logprob
        self.counters.generation_tokens += 1
        reason: str | None = None
        eos = token == self.eos and not params.ignore_eos and len(seq.generated) > params.min_tokens
        complete = seq.guide is not None and seq.guide.advance(token)
        if eos or complete:
            reason = "stop"
        elif (
            len(seq.generated) >= params.max_tokens
            or len(seq.prompt) + len(seq.generated) >= self.max_len
        ):
            reason = "length"
        full = self.tokenizer.decode(seq.generated, skip_special_tokens=True)
        if params.stop and len(seq.generated) > params.min_tokens:
            hits = [full.find(s) for s in params.stop if s in full]
            if hits:
                full = full[: min(hits)]
                reason = "stop"
        # A token may end inside a UTF-8 character: hold its bytes back until it is complete.
        if reason is None and full.endswith("\ufffd"):
            delta = ""
        else:
            delta = full[len(seq.text) :] if full.startswith(seq.text) else ""
            seq.text = full if full.startswith(seq.text) else seq.text
        tops = [top] if top is not None else None
        if reason is not None:
            # Freed (and counted) before the last output leaves, so that a client reading the
            # metrics right after its answer sees its slot free.
            self._release(seq, reason)
        seq.sink(
            StepOutput(
                text=delta,
                token_ids=[token],
                logprobs=tops,
                finished=reason is not None,
                finish_reason=reason,
                num_input_tokens=len(seq.prompt),
                num_output_tokens=len(seq.generated),
                cumulative_logprob=seq.cumulative_logprob,
                prompt_logprobs=(
                    seq.prompt_logprobs
                    if params.prompt_logprobs is not None and len(seq.generated) == 1
                    else None
                ),
            )
        )

    def _release(self, seq: Sequence, reason: str) -> None:
        seq.finished = True
        seq.e2e_ns = time.monotonic_ns() - seq.arrival_ns
        with self._cond:
            if seq in self._running:
                self._running.remove(seq)
                self._free.append(seq.slot)
                self._free.sort(reverse=True)
                self.counters.reserved_tokens -= seq.reserved
                self.counters.running = len(self._running)
            self._cond.notify_all()
        self._release_lora(seq)
        if self.on_finish is not None:
            self.on_finish(seq, reason)

    def _finish(self, seq: Sequence, reason: str, error: InferenceServerError | None) -> None:
        """End a sequence that produced no final output itself (cancelled, failed)."""
        if seq.finished:
            return
        self._release(seq, reason)
        seq.sink(
            StepOutput(
                text="",
                token_ids=[],
                logprobs=None,
                finished=True,
                finish_reason=reason,
                num_input_tokens=len(seq.prompt),
                num_output_tokens=len(seq.generated),
                cumulative_logprob=seq.cumulative_logprob,
                error=error or InferenceServerError(ErrorCode.CANCELLED, "Request was cancelled"),
            )
        )

    def _abort_all(self) -> None:
        """Under the lock, at close."""
        error = unavailable("the model is being unloaded")
        for seq in list(self._waiting) + list(self._running):
            self._release_lora(seq)
            if not seq.finished:
                seq.finished = True
                seq.sink(StepOutput("", [], None, True, "abort", len(seq.prompt), 0, 0.0, error))
        self._waiting.clear()
        self._running.clear()
