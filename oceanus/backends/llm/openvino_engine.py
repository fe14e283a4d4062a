"""`engine: "openvino"` in model.json: OpenVINO GenAI's continuous-batching pipeline (what
OpenVINO Model Server runs) as the engine, in a process of its own (openvino_worker.py).

The server side keeps everything the transformers engine does outside its forward passes
(scheduler.py): the queue and admission within the KV budget (so requests beyond it wait in
the server's queue), detokenizing with the model's Hugging Face tokenizer, stop strings, UTF-8
held back, metrics, cancellation. The worker owns the model: it traces it to OpenVINO on first
use (openvino_export.py, cached), then steps the pipeline while requests are live and sends
each step's new token ids back. The pipeline samples (greedy, temperature, top-k/p, penalties,
seeds) and runs guided decoding (structured output: `guided_decoding`'s json, json_object,
regex, choice and tagged_json (tool_choice "required"), through GenAI's xgrammar, on the
tokenizer converted to OpenVINO). What it cannot do is refused per request, naming the
model.json key that switches engines: a Lark `grammar`, `logit_bias`, prompt logprobs and more
than the chosen token's log probability."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import socket
import subprocess
import sys
from itertools import count
from pathlib import Path
from typing import Any

from oceanus.backends.llm import gguf_model
from oceanus.backends.llm.args import EngineArgs
from oceanus.backends.llm.engine_choice import GENAI_EXTRA, NNCF_EXTRA, installed
from oceanus.backends.llm.guide import choice_regex, guided_kind, tagged_json, without_key
from oceanus.backends.llm.openvino_worker import KINDS, Add, Drop, Ready, Start, Stop, Tokens
from oceanus.backends.llm.scheduler import Scheduler, Sequence
from oceanus.core.errors import InferenceServerError, internal, invalid_arg, unavailable
from oceanus.ipc.channel import Channel

log = logging.getLogger("oceanus.backends.llm")

PRECISIONS = {"float32": "f32", "bfloat16": "bf16"}


def kv_cache_gb(config: Any, tokens: int, precision: str) -> int:
    """Whole GB of paged KV cache for `tokens` tokens (the pipeline sizes its cache in GB)."""
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    per_token = 2 * int(config.num_hidden_layers) * kv_heads * head_dim
    per_token *= 4 if precision == "f32" else 2
    return max(1, math.ceil(tokens * per_token * 1.1 / 2**30))


class _GrammarEnd:
    """A guided sequence's `guide` here: the pipeline's xgrammar masks the logits, and its
    grammar is complete when it lets EOS through, which ends the reply even with ignore_eos.
    It keeps the request's StructuredOutputConfig fields, made once in `_prepare`."""

    def __init__(self, eos: int | None, fields: dict[str, Any]) -> None:
        self.eos = eos
        self.fields = fields

    def advance(self, token: int) -> bool:
        return token == self.eos


class OpenVinoEngine(Scheduler):
    thread_name = "llm-openvino"

    def __init__(self, args: EngineArgs, threads: int | None = None) -> None:
        try:
            import openvino_genai  # noqa: F401 - only to name the extra when it is missing
        except ImportError:
            raise unavailable(
                f"engine 'openvino' needs the openvino-genai package: {GENAI_EXTRA}"
            ) from None
        from transformers import AutoConfig, AutoTokenizer

        from oceanus.backends.llm.openvino_export import check_architecture

        check_architecture(args.model)
        remote = args.trust_remote_code
        if gguf_model.is_gguf(args.model):
            tokenizer = gguf_model.save_tokenizer(args.model, args.tokenizer, remote)
            config = gguf_model.config_of(args.model, remote)
            args = self._keep_gguf_quantization(args)
        else:
            tokenizer = AutoTokenizer.from_pretrained(args.tokenizer, trust_remote_code=remote)
            config = AutoConfig.from_pretrained(args.model, trust_remote_code=remote)
        if args.quantization and not installed("nncf"):
            raise unavailable(
                f"'quantization' {args.quantization!r} on engine 'openvino' compresses the "
                f"weights with NNCF: {NNCF_EXTRA}"
            )
        super().__init__(args, tokenizer, config)
        precision = PRECISIONS[args.dtype]
        kv = precision if args.kv_cache_dtype == "auto" else PRECISIONS[args.kv_cache_dtype]
        properties: dict[str, Any] = {"INFERENCE_PRECISION_HINT": precision}
        properties["KV_CACHE_PRECISION"] = kv
        if threads:
            properties["INFERENCE_NUM_THREADS"] = threads
        # The pipeline allocates its paged cache at load, in whole GB: what the admission
        # budget needs (plus one prefill chunk per sequence and 10 % of headroom for its
        # blocks, kv_cache_gb's), never more than the byte budget rounded up; admission keeps
        # the reservations within what that holds.
        needed = self.budget + self.slots * self.chunk
        cache_gb = min(math.ceil(self.kv.bytes / 2**30), kv_cache_gb(config, needed, kv))
        cache_gb = max(1, cache_gb)
        fits = int(cache_gb * 2**30 / 1.1) // self.kv.per_token - self.slots * self.chunk
        self.budget = max(self.max_len, min(self.budget, fits))
        self.counters.budget_tokens = self.budget
        scheduler = {
            "max_num_seqs": self.slots,
            "max_num_batched_tokens": self.chunk,
            "dynamic_split_fuse": True,  # its chunked prefill, sharing steps with decode
            "cache_size": max(
                cache_gb, kv_cache_gb(config, self.budget + self.slots * self.chunk, kv)
            ),
            "enable_prefix_caching": args.enable_prefix_caching,
        }
        parent, child = socket.socketpair()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "oceanus.backends.llm.openvino_worker", str(child.fileno())],
            pass_fds=(child.fileno(),),
        )
        child.close()
        self._channel = Channel(parent, KINDS)
        try:
            start = Start(
                str(args.model),
                scheduler,
                properties,
                args.quantization or "",
                str(args.tokenizer),
                remote,
            )
            self._channel.send(start)
            ready = self._channel.recv()
        except (EOFError, OSError):
            ready = Ready(f"the engine process exited ({self._process.wait()})", "", 0.0)
        if not isinstance(ready, Ready) or ready.error:
            self._stop_worker()
            detail = ready.error if isinstance(ready, Ready) else repr(ready)
            raise unavailable(f"the openvino engine failed to start: {detail}")
        self.ir_dir = ready.ir_dir
        self.no_guided = ready.no_guided  # why structured output is off ("": it is on)
        if self.no_guided:
            log.warning("LLM engine 'openvino': no guided decoding: %s", self.no_guided)
        self.export_s = ready.export_s
        # The weights the worker compiled (the IR's .bin files: fp32 as traced, or compressed).
        self.weights_bytes = sum(f.stat().st_size for f in Path(self.ir_dir).glob("*.bin"))
        self._rids = count(1)
        self._by_rid: dict[int, Sequence] = {}
        self._rid_of: dict[Sequence, int] = {}  # the ones sent (Sequence hashes by identity)
        self._dead = ""  # why the worker is gone, once it is
        self._start()

    @staticmethod
    def _keep_gguf_quantization(args: EngineArgs) -> EngineArgs:
        """A quantized GGUF file's weights stay about as small as in the file: without
        model.json's `quantization`, its 8-bit types become int8 and its 4-bit ones int4."""
        if args.quantization is not None:
            return args
        kept = gguf_model.kept_quantization(args.model)
        if kept is not None:
            log.info("GGUF %s: quantized weights kept as %s (NNCF)", args.model.name, kept)
        return dataclasses.replace(args, quantization=kept)

    # ---- the face ------------------------------------------------------------------------------

    def _prepare(self, seq: Sequence) -> None:
        params = seq.params
        if self._dead:
            raise unavailable(f"the openvino engine process is gone ({self._dead})")
        structured = self._structured_output(params)  # a Lark grammar: refused here
        if structured and self.no_guided:
            raise invalid_arg(
                f"guided decoding is off on engine 'openvino' for this model: {self.no_guided}; "
                "use engine 'transformers' (model.json)"
            )
        if params.logit_bias:
            raise self._refused("logit_bias")
        if params.prompt_logprobs is not None:
            raise self._refused("prompt logprobs (echo with logprobs, prompt_logprobs)")
        if params.logprobs is not None and params.logprobs > 1:
            raise self._refused(
                f"'logprobs' {params.logprobs} (it reports the chosen token's log probability only)"
            )
        if structured:
            seq.guide = _GrammarEnd(self.eos, structured)

    def _structured_output(self, params: Any) -> dict[str, Any] | None:
        """`guided_decoding` as GenAI's StructuredOutputConfig fields (openvino_grammar.py;
        None: free text); INVALID_ARG for a Lark grammar, which xgrammar does not read."""
        if params.guided_decoding is None:
            return None
        kind, value = guided_kind(params.guided_decoding)
        if kind == "json":
            return {"json_schema": value if isinstance(value, str) else json.dumps(value)}
        if kind == "json_object":
            return {"json_schema": '{"type": "object"}'}
        if kind == "regex":
            return {"regex": str(value)}
        if kind == "choice":
            return {"regex": choice_regex(value)}
        if kind == "tagged_json":  # a tool call in its parser's markers
            begin, schema, end = tagged_json(value)
            # llguidance's whitespace settings: not a JSON schema keyword xgrammar knows
            text = json.dumps(without_key(schema, "x-guidance"))
            if not begin and not end:
                return {"json_schema": text}
            return {"tagged_json": [begin, text, end]}
        raise self._refused("guided decoding by a Lark grammar (guided_grammar)")

    def _refused(self, what: str) -> InferenceServerError:
        """INVALID_ARG for what only the transformers engine serves, naming how to get it."""
        chosen = self.args.engine_source
        how = 'model.json\'s "engine": "auto" chose it' if chosen.startswith("auto") else chosen
        return invalid_arg(
            f"{what} is not supported by engine 'openvino' ({how}): set \"engine\": "
            '"transformers" in model.json (oceanus serve --engine transformers)'
        )

    def close(self) -> None:
        super().close()
        self._stop_worker()

    def _stop_worker(self) -> None:
        with contextlib.suppress(OSError):
            self._channel.send(Stop())
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._channel.close()

    # ---- the step loop -------------------------------------------------------------------------

    def _generation_config(self, seq: Sequence) -> dict[str, Any]:
        params = seq.params
        free = params.guided_decoding is None
        fields: dict[str, Any] = {
            "max_new_tokens": max(1, min(params.max_tokens, self.max_len - len(seq.prompt))),
            # A guided reply ends with its grammar: once complete, xgrammar allows only EOS,
            # which min_tokens would mask (the pipeline then picks special tokens) and
            # ignore_eos would step over into unguided text.
            "min_new_tokens": params.min_tokens if free else 0,
            "ignore_eos": params.ignore_eos and free,
            "logprobs": 1,  # the chosen token's: cumulative_logprob and `logprobs` need it
            "repetition_penalty": params.repetition_penalty,
            "presence_penalty": params.presence_penalty,
            "frequency_penalty": params.frequency_penalty,
            "eos": self.eos,
        }
        if isinstance(seq.guide, _GrammarEnd):
            fields["structured_output"] = seq.guide.fields
        if not params.greedy:
            fields["do_sample"] = True
            fields["temperature"] = params.temperature
            fields["top_p"] = params.top_p
            if params.top_k > 0:
                fields["top_k"] = params.top_k
            seed = (
                params.seed if params.seed is not None else hash((self.args.seed, seq.arrival_ns))
            )
            fields["rng_seed"] = seed & 0x7FFFFFFF
        return fields

    def _send(self, message: tuple[Any, ...]) -> None:
        try:
            self._channel.send(message)  # Channel.send holds the channel's own lock
        except OSError:
            raise self._gone() from None

    def _gone(self) -> InferenceServerError:
        """The worker is dead: remember why, say it once, and the error for its requests."""
        if not self._dead:
            self._dead = f"exit code {self._process.wait()}"
            log.error("LLM engine 'openvino': its process exited (%s)", self._dead)
        return internal(f"the openvino engine process is gone ({self._dead})")

    def _step(self) -> None:
        if self._dead:
            raise self._gone()
        for seq in [s for s in self._running if s.cancelled()]:
            self._finish(seq, "abort", None)
        for seq in self._running:
            if seq not in self._rid_of:
                rid = next(self._rids)
                self._rid_of[seq] = rid
                self._by_rid[rid] = seq
                self._send(Add(rid, seq.prompt, self._generation_config(seq)))
                self.counters.prompt_tokens += len(seq.prompt)
        if not self._running:
            return
        try:
            message = self._channel.recv()
        except (EOFError, OSError):
            raise self._gone() from None
        assert isinstance(message, Tokens)
        for rid, why in message.refused:
            refused = self._by_rid.get(rid)
            if refused is not None:
                self._forget(refused)  # never added there: nothing to drop
                self._finish(refused, "abort", invalid_arg(f"guided_decoding: {why}"))
        error = internal(f"generation failed: {message.error}") if message.error else None
        for rid, ids, logprobs, end in message.items:
            found = self._by_rid.get(rid)
            if found is None:
                continue  # ended here before the worker knew
            seq = found
            if end:
                self._forget(seq)  # the worker is done with it: nothing to drop there
            for token, logprob in zip(ids, logprobs or [0.0] * len(ids), strict=True):
                if seq.finished:
                    break
                top = {token: logprob} if seq.params.logprobs is not None else None
                self._advance(seq, token, logprob, top)
            if end and not seq.finished:  # the pipeline ended it where we did not
                self._finish(seq, "abort", error or internal(f"generation ended: {end}"))

    def _release(self, seq: Sequence, reason: str) -> None:
        """Ended here (EOS, a stop string, a length, a cancel): the worker drops it too."""
        super()._release(seq, reason)
        rid = self._forget(seq)
        if rid is not None and not self._dead:
            self._send(Drop(rid))

    def _forget(self, seq: Sequence) -> int | None:
        rid = self._rid_of.pop(seq, None)
        if rid is not None:
            self._by_rid.pop(rid, None)
        return rid
