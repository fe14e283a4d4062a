"""The CPU engine: continuous batching over transformers' model code and PyTorch.

One thread runs the step loop. Every step it
1. drops sequences whose reader left (their slot is free at once),
2. admits waiting sequences while a slot is free and the KV-cache token budget holds their
   reservation (prompt + max_tokens, capped at max_model_len); the rest keep waiting,
3. prefills at most `max_num_batched_tokens` prompt tokens, over as many prompts as fit, in one
   batched forward pass (chunked prefill: a long prompt takes several steps, so the running
   streams never wait for more than one chunk),
4. decodes one token for every sequence past its prompt, in one batched forward pass.
Sequences join and leave between steps. The KV cache is a fixed set of slots (kv_cache.py).

Nothing here knows Oceanus' requests: `submit` takes token ids, sampling parameters and a
callback; the backend (backend.py) and the benchmarks (bench/llm.py) both drive it."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from oceanus.backends.llm import loading
from oceanus.backends.llm.args import EngineArgs
from oceanus.backends.llm.kv_cache import SlotCache, attention_mask, packed_mask
from oceanus.backends.llm.sampler import Choice, choose, needs_row_work
from oceanus.backends.llm.sampling import SamplingParams
from oceanus.core.errors import ErrorCode, InferenceServerError, internal, invalid_arg, unavailable

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
    generator: torch.Generator | None = None
    finished: bool = False
    guide: Any = None  # guide.Guide: structured output's grammar state (None: free text)


@dataclass
class EngineCounters:
    """Read by the backend's metrics (plain ints written by the engine thread)."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    running: int = 0
    waiting: int = 0
    reserved_tokens: int = 0
    budget_tokens: int = 0


# Called when a sequence ends: (sequence, finish reason); and after every step.
FinishHook = Callable[[Sequence, str], None]
StepHook = Callable[["Engine"], None]
# Called after every batch of sink calls (a forward pass's outputs, a step's or close's aborts):
# a sink may hold what it was given and pass the whole batch on at once (backend.py does).
FlushHook = Callable[[], None]


class Engine:
    def __init__(
        self,
        args: EngineArgs,
        threads: int | None = None,
        onednn_linears: bool = True,
        row_attention: bool = True,
        fused_mlp: bool = True,
    ) -> None:
        loaded = loading.load(args, onednn_linears, fused_mlp, row_attention)
        self.args = args
        self.dtype = loaded.dtype
        self.tokenizer: Any = loaded.tokenizer
        model = loaded.model
        self.model: Any = model
        self.packed_linears = loaded.packed_linears
        self.fused_mlps = loaded.fused_mlps
        self.row_attention = loaded.row_attention
        self._cache_kw = loaded.cache_kw
        self._keep_kw = loaded.keep_kw
        config = model.config
        self.max_len = int(args.max_model_len or config.max_position_embeddings)
        heads = int(config.num_attention_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        self.slots = args.max_num_seqs
        self.chunk = args.max_num_batched_tokens
        self.cache = SlotCache(
            int(config.num_hidden_layers),
            self.slots,
            kv_heads,
            self.max_len + self.chunk,  # room for the padding of a batched prefill
            head_dim,
            loaded.kv_dtype,
        )
        self.budget = max(args.kv_cache_tokens or self.slots * self.max_len, self.max_len)
        eos = config.eos_token_id if config.eos_token_id is not None else None
        self.eos: int | None = eos[0] if isinstance(eos, list) else eos
        self.pad = int(config.pad_token_id if config.pad_token_id is not None else 0)
        self.vocab = int(config.vocab_size)
        self._llg_tokenizer: Any = None  # llguidance's tokenizer, made on the first guided request
        self.threads = threads
        self.counters = EngineCounters(budget_tokens=self.budget)
        self.on_finish: FinishHook | None = None
        self.on_step: StepHook | None = None
        self.on_flush: FlushHook | None = None
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []
        self._free = list(range(self.slots - 1, -1, -1))  # pop() gives the lowest slot
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="llm-engine", daemon=True)
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
    ) -> Sequence:
        """Queue a sequence; `sink` gets its outputs on the engine thread. Raises INVALID_ARG
        for a prompt that cannot fit."""
        if not prompt:
            raise invalid_arg("the prompt is empty")
        if len(prompt) >= self.max_len:
            raise invalid_arg(
                f"the prompt has {len(prompt)} tokens; this model's max_model_len is "
                f"{self.max_len} and at least one token must be generated"
            )
        seq = Sequence(prompt, params, sink, cancelled)
        if params.guided is not None:
            from oceanus.backends.llm.guide import Guide, llg_tokenizer

            if self._llg_tokenizer is None:
                self._llg_tokenizer = llg_tokenizer(self.tokenizer, self.vocab, self.eos)
            seq.guide = Guide(self._llg_tokenizer, params.guided)
        seq.reserved = min(len(prompt) + params.max_tokens, self.max_len)
        if params.seed is not None:
            seq.generator = torch.Generator().manual_seed(params.seed)
        elif not params.greedy:
            seq.generator = torch.Generator().manual_seed(
                hash((self.args.seed, seq.arrival_ns)) & 0x7FFFFFFF
            )
        with self._cond:
            if self._closed:
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
        need = sum(s.reserved for s in self._waiting)
        return self.counters.reserved_tokens + need <= self.budget or (
            not self._running and len(self._waiting) == 1
        )

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()

    # ---- the step loop -------------------------------------------------------------------------

    def _run(self) -> None:
        if self.threads:
            torch.set_num_threads(self.threads)
        with torch.inference_mode():
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
        while self._waiting and self._free:
            seq = self._waiting[0]
            if self.counters.reserved_tokens + seq.reserved > self.budget and self._running:
                break
            self._waiting.popleft()
            seq.slot = self._free.pop()
            self.counters.reserved_tokens += seq.reserved
            self._running.append(seq)
        self.counters.waiting = len(self._waiting)
        self.counters.running = len(self._running)
        if not self._waiting:
            self._cond.notify_all()

    def _step(self) -> None:
        for seq in [s for s in self._running if s.cancelled()]:
            self._finish(seq, "abort", None)
        prefill: list[Sequence] = []
        room = self.chunk
        for seq in self._running:
            if seq.prefilled < len(seq.prompt) and room > 0:
                prefill.append(seq)
                room -= min(room, len(seq.prompt) - seq.prefilled)
        if prefill:
            self._prefill(prefill)
        decode = [s for s in self._running if s.prefilled == len(s.prompt) and not s.finished]
        if decode:
            self._decode(decode)

    def _forward(self, seqs: list[Sequence], tokens: list[list[int]], starts: list[int]) -> Any:
        """One batched pass; returns logits `[batch, q, vocab]`."""
        q = max(len(t) for t in tokens)
        ids = torch.full((len(seqs), q), self.pad, dtype=torch.long)
        for row, chunk in enumerate(tokens):
            ids[row, : len(chunk)] = torch.tensor(chunk, dtype=torch.long)
        # Padding continues the positions: its cells lie beyond the sequence and are
        # overwritten before any query may see them.
        positions = torch.tensor(starts, dtype=torch.long)[:, None] + torch.arange(q)[None, :]
        kv_len = int(positions.max()) + 1
        rows = self.row_attention and q == 1
        self.cache.bind([s.slot for s in seqs], positions, kv_len, whole=rows)
        mask = attention_mask(positions, kv_len, self.dtype)
        kwargs: dict[str, Any] = {self._cache_kw: self.cache}
        if rows:
            kwargs["slot_lengths"] = [start + 1 for start in starts]
            kwargs["slot_rows"] = [s.slot for s in seqs]
        out = self.model(
            input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=True, **kwargs
        )
        return out.logits

    def _prefill(self, seqs: list[Sequence]) -> None:
        """Every chosen prompt's next chunk in one packed pass: the chunks lie back to back in
        one row (no padding, so the token budget is all real work) and the mask keeps each
        sequence to its own keys. All newcomers of a burst get their first token after one
        such pass when their prompts fit the budget, not one after another."""
        room = self.chunk
        chunks: list[list[int]] = []
        for seq in seqs:
            take = min(room, len(seq.prompt) - seq.prefilled)
            chunks.append(seq.prompt[seq.prefilled : seq.prefilled + take])
            room -= take
        ids: list[int] = []
        q_seq: list[int] = []
        q_pos: list[int] = []
        q_slot: list[int] = []
        k_seq: list[int] = []
        k_pos: list[int] = []
        k_slot: list[int] = []
        for index, (seq, chunk) in enumerate(zip(seqs, chunks, strict=True)):
            start, end = seq.prefilled, seq.prefilled + len(chunk)
            ids += chunk
            q_seq += [index] * len(chunk)
            q_pos += range(start, end)
            q_slot += [seq.slot] * len(chunk)
            k_seq += [index] * end
            k_pos += range(end)
            k_slot += [seq.slot] * end
        positions = torch.tensor([q_pos], dtype=torch.long)
        key_pos = torch.tensor(k_pos, dtype=torch.long)
        key_seq = torch.tensor(k_seq, dtype=torch.long)
        self.cache.bind_packed(
            torch.tensor([q_slot], dtype=torch.long),
            positions,
            torch.tensor(k_slot, dtype=torch.long),
            key_pos,
            whole=self.row_attention,
        )
        mask = packed_mask(
            torch.tensor(q_seq, dtype=torch.long), positions[0], key_seq, key_pos, self.dtype
        )
        # Only the rows of prompts that end in this pass need logits (the LM head over every
        # prompt token would cost as much as a layer or two).
        done: list[Sequence] = []
        rows: list[int] = []
        last = -1
        for seq, chunk in zip(seqs, chunks, strict=True):
            last += len(chunk)
            seq.prefilled += len(chunk)
            self.counters.prompt_tokens += len(chunk)
            if seq.prefilled == len(seq.prompt):
                done.append(seq)
                rows.append(last)
        kwargs: dict[str, Any] = {self._cache_kw: self.cache}
        if self.row_attention:
            kwargs["slot_chunks"] = [
                (seq.slot, seq.prefilled - len(chunk), len(chunk))
                for seq, chunk in zip(seqs, chunks, strict=True)
            ]
        if self._keep_kw:
            kwargs["logits_to_keep"] = torch.tensor(rows or [last], dtype=torch.long)
        logits = self.model(
            input_ids=torch.tensor([ids], dtype=torch.long),
            position_ids=positions,
            attention_mask=mask,
            use_cache=True,
            **kwargs,
        ).logits[0]
        if done:
            self._emit(done, (logits if self._keep_kw else logits[rows]).float())

    def _decode(self, seqs: list[Sequence]) -> None:
        # In slot order: when the running sequences hold a run of consecutive slots (every slot
        # busy, as under full load), the cache reads them as a view, with no gather.
        seqs = sorted(seqs, key=lambda s: s.slot)
        tokens = [[s.generated[-1]] for s in seqs]
        starts = [len(s.prompt) + len(s.generated) - 1 for s in seqs]
        logits = self._forward(seqs, tokens, starts)
        self._emit(seqs, logits[:, -1].float())

    def _emit(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        """Choose each sequence's next token from its `[vocab]` row and send what it made."""
        simple = [not needs_row_work(s.params) for s in seqs]
        argmax: list[int] = []
        chosen: list[float] = []
        if any(simple):  # the whole batch at once: no per-row ops for the plain greedy rows
            best = torch.argmax(logits, dim=-1)
            argmax = best.tolist()
            chosen = torch.log_softmax(logits, -1).gather(1, best[:, None])[:, 0].tolist()
        for row, seq in enumerate(seqs):
            if simple[row]:
                choice = Choice(int(argmax[row]), float(chosen[row]), None)
            else:
                if seq.guide is not None:
                    seq.guide.mask(logits[row])
                choice = choose(
                    logits[row], seq.params, seq.prompt, seq.generated, self.eos, seq.generator
                )
            self._advance(seq, choice)
        self._flush()  # a prefill's first tokens leave before the decode pass that follows

    def _advance(self, seq: Sequence, choice: Choice) -> None:
        params = seq.params
        now = time.monotonic_ns()
        if not seq.generated:
            seq.first_token_ns = now
        else:
            seq.token_gaps_ns.append(now - seq.last_token_ns)
        seq.last_token_ns = now
        seq.generated.append(choice.token)
        seq.cumulative_logprob += choice.logprob
        self.counters.generation_tokens += 1
        reason: str | None = None
        eos = (
            choice.token == self.eos
            and not params.ignore_eos
            and len(seq.generated) > params.min_tokens
        )
        complete = seq.guide is not None and seq.guide.advance(choice.token)
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
        top = [choice.top] if choice.top is not None else None
        if reason is not None:
            # Freed (and counted) before the last output leaves, so that a client reading the
            # metrics right after its answer sees its slot free.
            self._release(seq, reason)
        seq.sink(
            StepOutput(
                text=delta,
                token_ids=[choice.token],
                logprobs=top,
                finished=reason is not None,
                finish_reason=reason,
                num_input_tokens=len(seq.prompt),
                num_output_tokens=len(seq.generated),
                cumulative_logprob=seq.cumulative_logprob,
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
            if not seq.finished:
                seq.finished = True
                seq.sink(StepOutput("", [], None, True, "abort", len(seq.prompt), 0, 0.0, error))
        self._waiting.clear()
        self._running.clear()
