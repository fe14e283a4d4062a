"""The CPU engine: continuous batching over transformers' model code and PyTorch.

The queue, admission and finishing are scheduler.py's. Each step here
1. prefills at most `max_num_batched_tokens` prompt tokens, over as many prompts as fit, in one
   batched forward pass (chunked prefill: a long prompt takes several steps, so the running
   streams never wait for more than one chunk),
2. decodes one token for every sequence past its prompt, in one batched forward pass.
Sequences join and leave between steps. The KV cache is a pool grown as sequences grow, within
the memory budget (kv_cache.py, memory.py).

Nothing here knows Oceanus' requests: `submit` takes token ids, sampling parameters and a
callback; the backend (backend.py) and the benchmarks (bench/llm.py) both drive it."""

from __future__ import annotations

from typing import Any

import torch

from oceanus.backends.llm import loading
from oceanus.backends.llm.args import EngineArgs
from oceanus.backends.llm.kv_cache import SlotCache, attention_mask, packed_mask
from oceanus.backends.llm.lora import Adapters
from oceanus.backends.llm.sampler import Choice, choose, needs_row_work
from oceanus.backends.llm.scheduler import (
    EngineCounters,
    FinishHook,
    FlushHook,
    Scheduler,
    Sequence,
    StepHook,
    StepOutput,
)
from oceanus.core.errors import invalid_arg

__all__ = [
    "Engine",
    "EngineCounters",
    "FinishHook",
    "FlushHook",
    "Sequence",
    "StepHook",
    "StepOutput",
]


class Engine(Scheduler):
    def __init__(
        self,
        args: EngineArgs,
        threads: int | None = None,
        onednn_linears: bool = True,
        row_attention: bool = True,
        fused_mlp: bool = True,
    ) -> None:
        loaded = loading.load(args, onednn_linears, fused_mlp, row_attention)
        model = loaded.model
        super().__init__(args, loaded.tokenizer, model.config)
        self.dtype = loaded.dtype
        self.model: Any = model
        self.packed_linears = loaded.packed_linears
        self.fused_mlps = loaded.fused_mlps
        self.row_attention = loaded.row_attention
        self._cache_kw = loaded.cache_kw
        self._keep_kw = loaded.keep_kw
        config = model.config
        heads = int(config.num_attention_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        self.weights_bytes = loaded.weights_bytes
        self.cache = SlotCache(
            int(config.num_hidden_layers),
            kv_heads,
            head_dim,
            loaded.kv_dtype,
            max_tokens=self.budget,
            block=args.block_size,
            prefix_caching=args.enable_prefix_caching,
        )
        self._llg_tokenizer: Any = None  # llguidance's tokenizer, made on the first guided request
        # LoRA (lora.py): the decoder's linears wrapped once, the start's adapters loaded.
        self.adapters: Adapters | None = None
        if args.enable_lora:
            self.adapters = Adapters(model, args.max_lora_rank, args.max_loras, self.dtype)
            for name, folder in args.lora_modules:
                self.adapters.load(name, folder)
        self.threads = threads
        self._start()

    def _prepare(self, seq: Sequence) -> None:
        params = seq.params
        if params.guided is not None:
            from oceanus.backends.llm.guide import Guide, llg_tokenizer

            if self._llg_tokenizer is None:
                self._llg_tokenizer = llg_tokenizer(self.tokenizer, self.vocab, self.eos)
            seq.guide = Guide(self._llg_tokenizer, params.guided)
        if params.seed is not None:
            seq.generator = torch.Generator().manual_seed(params.seed)
        elif not params.greedy:
            seq.generator = torch.Generator().manual_seed(
                hash((self.args.seed, seq.arrival_ns)) & 0x7FFFFFFF
            )

    def _acquire_lora(self, name: str) -> int:
        if self.adapters is None:
            raise invalid_arg(
                f"LoRA adapter '{name}' asked of a model without LoRA (model.json enable_lora)"
            )
        return self.adapters.acquire(name)

    def lora_activity(self) -> tuple[list[str], list[str]]:
        if self.adapters is None:
            return [], []
        with self._cond:
            running = {s.lora_id for s in self._running if s.lora_id}
            waiting = {s.lora_id for s in self._waiting if s.lora_id}
        name = self.adapters.name_of
        return sorted(name(i) for i in running), sorted(name(i) for i in waiting)

    def lora_names(self) -> list[str] | None:
        return None if self.adapters is None else self.adapters.names()

    def _release_lora(self, seq: Sequence) -> None:
        if seq.lora_held and self.adapters is not None:
            seq.lora_held = False
            self.adapters.release(seq.lora_id)

    def _lora_rows(self, per_row: list[int]) -> None:
        """Before a pass: which flattened token rows run which adapter."""
        if self.adapters is not None:
            self.adapters.state.set_rows(per_row)

    def _release(self, seq: Sequence, reason: str) -> None:
        super()._release(seq, reason)
        # On the engine thread, between passes. A sequence that ended normally leaves its full
        # blocks to the prefix cache (the last token's KV was never written); an aborted one
        # (cancelled, or a failed pass that may have left its cells half written) frees them.
        if reason in ("stop", "length"):
            self.cache.keep(seq.slot, seq.prompt + seq.generated[:-1], seq.lora_id)
        else:
            self.cache.free(seq.slot)

    def _reuse_prefix(self, seq: Sequence) -> None:
        """A newcomer's prompt, looked up in the prefix cache: the cached blocks it starts with
        are copied into its range and its prefill starts after them. A prompt found whole still
        computes its last token, whose logits give the first output token (as vLLM does)."""
        seq.cached_tokens = 0
        # Prompt logprobs need every prompt row's logits: such a prompt is computed whole.
        if not self.cache.prefix_caching or seq.params.prompt_logprobs is not None:
            return
        entry, cached = self.cache.lookup(seq.prompt, seq.lora_id)
        cached = min(cached, len(seq.prompt) - 1)
        self.counters.prefix_cache_queries += len(seq.prompt)
        if cached <= 0:
            return
        self.cache.take(seq.slot, entry, cached, seq.reserved)
        seq.cached_tokens = cached
        seq.prefilled = cached
        self.counters.prefix_cache_hits += cached
        self.counters.prompt_tokens += cached  # vLLM counts a request's whole prompt

    def _run(self) -> None:
        if self.threads:
            torch.set_num_threads(self.threads)
        with torch.inference_mode():
            super()._run()

    def _step(self) -> None:
        for seq in [s for s in self._running if s.cancelled()]:
            self._finish(seq, "abort", None)
        for seq in self._running:
            if seq.cached_tokens is None and not seq.finished:
                self._reuse_prefix(seq)
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
        for seq, start in zip(seqs, starts, strict=True):
            self.cache.reserve(seq.slot, start + q, seq.reserved)
        offsets = [self.cache.offset(s.slot) for s in seqs]
        self.cache.bind(offsets, positions, kv_len, whole=rows)
        mask = attention_mask(positions, kv_len, self.dtype)
        kwargs: dict[str, Any] = {self._cache_kw: self.cache}
        if rows:
            kwargs["slot_lengths"] = [start + 1 for start in starts]
            kwargs["slot_offsets"] = offsets
        self._lora_rows([s.lora_id for s in seqs for _ in range(q)])
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
        q_cell: list[int] = []
        k_seq: list[int] = []
        k_pos: list[int] = []
        k_cell: list[int] = []
        firsts: list[int] = []
        for seq, chunk in zip(seqs, chunks, strict=True):
            self.cache.reserve(seq.slot, seq.prefilled + len(chunk), seq.reserved)
        for index, (seq, chunk) in enumerate(zip(seqs, chunks, strict=True)):
            start, end = seq.prefilled, seq.prefilled + len(chunk)
            first = self.cache.offset(seq.slot)
            firsts.append(first)
            ids += chunk
            q_seq += [index] * len(chunk)
            q_pos += range(start, end)
            q_cell += range(first + start, first + end)
            k_seq += [index] * end
            k_pos += range(end)
            k_cell += range(first, first + end)
        positions = torch.tensor([q_pos], dtype=torch.long)
        key_pos = torch.tensor(k_pos, dtype=torch.long)
        key_seq = torch.tensor(k_seq, dtype=torch.long)
        self.cache.bind_packed(
            torch.tensor([q_cell], dtype=torch.long),
            torch.tensor(k_cell, dtype=torch.long),
            whole=self.row_attention,
        )
        mask = packed_mask(
            torch.tensor(q_seq, dtype=torch.long), positions[0], key_seq, key_pos, self.dtype
        )
        # Only the rows of prompts that end in this pass need logits (the LM head over every
        # prompt token would cost as much as a layer or two), and every row of a prompt whose
        # request asked for prompt logprobs.
        done: list[Sequence] = []
        done_rows: list[int] = []  # indices into `rows`
        wants: list[tuple[Sequence, int, int, int]] = []  # (seq, index into rows, start, length)
        rows: list[int] = []
        last = -1
        for seq, chunk in zip(seqs, chunks, strict=True):
            first_row = last + 1
            last += len(chunk)
            start = seq.prefilled
            seq.prefilled += len(chunk)
            self.counters.prompt_tokens += len(chunk)
            if seq.params.prompt_logprobs is not None:
                wants.append((seq, len(rows), start, len(chunk)))
                rows += range(first_row, last + 1)
                if seq.prefilled == len(seq.prompt):
                    done.append(seq)
                    done_rows.append(len(rows) - 1)
            elif seq.prefilled == len(seq.prompt):
                done.append(seq)
                done_rows.append(len(rows))
                rows.append(last)
        kwargs: dict[str, Any] = {self._cache_kw: self.cache}
        if self.row_attention:
            kwargs["slot_chunks"] = [
                (first, seq.prefilled - len(chunk), len(chunk))
                for first, seq, chunk in zip(firsts, seqs, chunks, strict=True)
            ]
        if self._keep_kw:
            kwargs["logits_to_keep"] = torch.tensor(rows or [last], dtype=torch.long)
        self._lora_rows([s.lora_id for s, chunk in zip(seqs, chunks, strict=True) for _ in chunk])
        logits = self.model(
            input_ids=torch.tensor([ids], dtype=torch.long),
            position_ids=positions,
            attention_mask=mask,
            use_cache=True,
            **kwargs,
        ).logits[0]
        kept = (logits if self._keep_kw else logits[rows]).float()
        for seq, index, start, length in wants:
            self._prompt_logprobs(seq, kept[index : index + length], start)
        if done:
            self._emit(done, kept[done_rows] if wants else kept)

    def _prompt_logprobs(self, seq: Sequence, logits: torch.Tensor, start: int) -> None:
        """The logprobs of the prompt tokens that rows `start`.. predict (row i predicts token
        i + 1), with each one's rank in the vocabulary and the `prompt_logprobs` likeliest."""
        top = seq.params.prompt_logprobs or 0
        targets = seq.prompt[start + 1 : start + 1 + len(logits)]
        if not targets:
            return
        logprobs = torch.log_softmax(logits[: len(targets)], dim=-1)
        wanted = torch.tensor(targets, dtype=torch.long)[:, None]
        chosen = logprobs.gather(1, wanted)
        ranks = (logprobs > chosen).sum(-1) + 1
        values, indices = torch.topk(logprobs, top) if top else (None, None)
        for row, token in enumerate(targets):
            step = {token: (float(chosen[row, 0]), int(ranks[row]))}
            if values is not None and indices is not None:
                for rank, (t, v) in enumerate(zip(indices[row], values[row], strict=True)):
                    step.setdefault(int(t), (float(v), rank + 1))
            seq.prompt_logprobs.append(step)

    def _decode(self, seqs: list[Sequence]) -> None:
        seqs = sorted(seqs, key=lambda s: s.slot)  # a stable order: the same batch each step
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
            self._advance(seq, choice.token, choice.logprob, choice.top)
        self._flush()  # a prefill's first tokens leave before the decode pass that follows
