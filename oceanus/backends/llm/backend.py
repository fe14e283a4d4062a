"""The LLM backend: Triton's vLLM model folders served by our CPU engine (engine.py).

The config is completed as Triton's vLLM backend completes it (decoupled, `max_batch_size: 0`,
its inputs and outputs); each request is parsed here into a prompt and sampling parameters,
handed to the engine, and answered through its response stream as the engine produces text.
`execute_requests` returns once the engine has admitted the request, so requests beyond the
engine's KV-cache budget wait in the server's queue (where the queue metrics see them).

A request that carries the core's typed `GenerationRequest` (the OpenAI frontend's: prompt token
ids and SamplingParams) skips the tensors: its ids go to the engine as they are (no second
tokenization, no second BOS), and its responses carry a `GenerationOutput` instead of tensors."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch  # noqa: F401 - imported here so that a missing torch names the llm extra
import transformers  # noqa: F401 - likewise
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.backends.llm.args import MODEL_JSON, EngineArgs, read_engine_args
from oceanus.backends.llm.classifier import SCORE_INPUT, is_classifier
from oceanus.backends.llm.engine import Engine
from oceanus.backends.llm.metrics import LlmMetrics
from oceanus.backends.llm.sampling import compile_guide, parse_sampling_parameters
from oceanus.backends.llm.scheduler import Scheduler, StepOutput
from oceanus.core.backend import (
    Backend,
    LoadContext,
    RequestInstance,
    RequestJob,
    RequestsResult,
    ResponseStream,
)
from oceanus.core.errors import InferenceServerError, invalid_arg
from oceanus.core.generation import (
    GenerationInfo,
    GenerationOutput,
    LoraAdapters,
    PromptLogprob,
    SamplingParams,
)
from oceanus.core.response_stream import Send, send_together

log = logging.getLogger("oceanus.backends.llm")

_S, _B = mc.DataType.TYPE_STRING, mc.DataType.TYPE_BOOL
# The vLLM backend's tensors (triton-inference-server/vllm_backend src/model.py), in its order.
INPUTS: list[tuple[str, int, list[int], bool]] = [
    ("text_input", _S, [1], False),
    ("stream", _B, [1], True),
    ("sampling_parameters", _S, [1], True),
    ("exclude_input_in_output", _B, [1], True),
    ("return_finish_reason", _B, [1], True),
    ("return_cumulative_logprob", _B, [1], True),
    ("return_logprobs", _B, [1], True),
    ("return_num_input_tokens", _B, [1], True),
    ("return_num_output_tokens", _B, [1], True),
    # Embedding models' request (a JSON object), as the vLLM backend reserves it for the
    # OpenAI frontend's /v1/embeddings (embedder.py).
    ("embedding_request", _S, [1], True),
]
OUTPUTS: list[tuple[str, int, list[int]]] = [
    ("text_output", _S, [-1]),
    ("finish_reason", _S, [-1]),
    ("cumulative_logprob", mc.DataType.TYPE_FP32, [-1]),
    ("logprobs", _S, [-1]),
    ("num_input_tokens", mc.DataType.TYPE_UINT32, [1]),
    ("num_output_tokens", mc.DataType.TYPE_UINT32, [-1]),
]
_FLAGS = (
    "return_finish_reason",
    "return_cumulative_logprob",
    "return_logprobs",
    "return_num_input_tokens",
    "return_num_output_tokens",
)


class LlmBackend(Backend):
    name = "vllm"
    default_model_filename = MODEL_JSON

    def complete_config(self, config: mc.ModelConfig, model_path: Path, autocomplete: bool) -> None:
        if autocomplete:
            have_in = {t.name for t in config.input}
            for name, dtype, dims, optional in INPUTS:
                if name not in have_in:
                    config.input.add(name=name, data_type=dtype, dims=dims, optional=optional)
            have_out = {t.name for t in config.output}
            for name, dtype, dims in OUTPUTS:
                if name not in have_out:
                    config.output.add(name=name, data_type=dtype, dims=dims)
            if _cross_encoder(model_path, config.name) and SCORE_INPUT not in have_in:
                config.input.add(name=SCORE_INPUT, data_type=_S, dims=[1], optional=True)
            config.model_transaction_policy.decoupled = True
            config.max_batch_size = 0
        if not config.model_transaction_policy.decoupled:
            raise invalid_arg(
                f"unable to load model '{config.name}': the vLLM backend must be configured to "
                "use decoupled model transaction policy"
            )
        if config.max_batch_size != 0:
            raise invalid_arg(
                f"unable to load model '{config.name}': the vLLM backend batches on its own: "
                f"max_batch_size must be 0, got {config.max_batch_size}"
            )

    def load(self, context: LoadContext) -> RequestInstance:
        from oceanus.backends.llm.embedder import EmbeddingInstance, is_embedding_model

        args = read_engine_args(context.files.version_dir, context.config.name)
        if is_classifier(Path(args.model)):  # a cross-encoder: it scores pairs
            from oceanus.backends.llm.classifier import ClassifierInstance

            return ClassifierInstance(context, args)
        # The model's own config says it embeds, or model.json asks a decoder to (vLLM's
        # runner "pooling").
        if args.runner == "pooling" or is_embedding_model(Path(args.model)):
            return EmbeddingInstance(context, args)
        return LlmInstance(context, args)


def _cross_encoder(model_file: Path, name: str) -> bool:
    """Whether the newest version's model.json names a `*ForSequenceClassification` folder."""
    try:
        return is_classifier(Path(read_engine_args(model_file.parent, name).model))
    except InferenceServerError:
        return False  # the load says what is wrong


def make_engine(args: EngineArgs, threads: int | None) -> Scheduler:
    """model.json's `engine` (resolved from "auto" by engine_choice.py): ours on transformers
    or OpenVINO GenAI's pipeline."""
    if args.engine == "openvino":
        from oceanus.backends.llm.openvino_engine import OpenVinoEngine

        return OpenVinoEngine(args, threads=threads)
    return Engine(args, threads=threads)


@dataclass
class _Request:
    """What one request asked for, and what has been sent so far."""

    stream: ResponseStream
    streaming: bool
    prepend: str  # the prompt, when the text output starts with it
    flags: dict[str, bool]
    params: SamplingParams
    received_ns: int
    typed: bool = False  # a GenerationRequest: answered with GenerationOutputs, no tensors
    prompt: list[int] | None = None  # its token ids (typed requests: for prompt logprobs)
    prompt_logprobs: list[dict[int, tuple[float, int]]] | None = None  # not sent yet
    tokens_sent: int = 0
    pieces: list[str] = field(default_factory=list)  # non-streaming: the text so far
    logprobs: list[dict[int, float]] = field(default_factory=list)
    chosen: list[int] = field(default_factory=list)  # the tokens those logprobs are for
    first_ns: int = 0
    last_ns: int = 0


def _flag(inputs: dict[str, np.ndarray], name: str) -> bool | None:
    array = inputs.get(name)
    if array is None or array.size == 0:
        return None
    return bool(array.reshape(-1)[0])


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


class LlmInstance(RequestInstance):
    def __init__(self, context: LoadContext, args: EngineArgs) -> None:
        """`args`: model.json as `load` read it, once (engine "auto" decides on what the
        machine has at that moment: a second reading could decide otherwise)."""
        config = context.config
        self.name = config.name
        started = time.monotonic()
        self.engine = make_engine(args, threads=args.num_threads or context.spec.cpu_threads)
        # The responses of one forward pass (a token for each running request) go to the event
        # loop together, in one wake-up, not one per request (filled and emptied on the engine
        # thread only).
        self._outbox: list[Send] = []
        self.engine.on_flush = self._flush
        log.info(
            "model '%s': LLM engine '%s' (%s) ready in %.1f s (%s, max_model_len %d, %d slots, "
            "prefill chunk %d; %s)",
            config.name,
            args.engine,
            args.engine_source,
            time.monotonic() - started,
            args.model,
            self.engine.max_len,
            self.engine.slots,
            self.engine.chunk,
            self.engine.describe_memory(),
        )
        self.metrics: LlmMetrics | None = None
        if context.server is not None:
            version = context.files.version_dir.name
            server = context.server
            self.metrics = LlmMetrics(
                server.custom_metrics,
                config.name,
                version,
                args.served_model_name,
                lambda: server.queued_count(config.name, version),
            )
            self.metrics.watch(self.engine)

    def _flush(self) -> None:
        if self._outbox:
            sends, self._outbox = self._outbox, []
            send_together(sends)

    def generation_info(self) -> GenerationInfo:
        return GenerationInfo(self.engine.max_len, Path(self.engine.args.tokenizer))

    def lora_adapters(self) -> LoraAdapters | None:
        return getattr(self.engine, "adapters", None)

    def close(self) -> None:
        self.engine.close()
        if self.metrics is not None:
            self.metrics.close()

    def execute_requests(self, jobs: Sequence[RequestJob]) -> RequestsResult:
        outputs: list[dict[str, np.ndarray] | InferenceServerError] = []
        for job in jobs:
            try:
                self._start(job)
                outputs.append({})
            except InferenceServerError as exc:
                outputs.append(exc)
        # Return only once the engine took them: requests beyond its budget wait in our queue.
        self.engine.wait_for_room()
        return RequestsResult(outputs=outputs)

    def _start(self, job: RequestJob) -> None:
        stream = job.stream
        if stream is None:
            raise invalid_arg(f"model '{self.name}' is decoupled: it answers through a stream")
        typed = job.request.generation
        if typed is not None:
            self._submit(
                _Request(
                    stream=stream,
                    streaming=typed.stream,
                    prepend="",
                    flags={},
                    params=compile_guide(typed.sampling),
                    received_ns=job.request.received_ns,
                    typed=True,
                    prompt=typed.prompt_token_ids,
                ),
                typed.prompt_token_ids,
                stream,
            )
            return
        inputs = job.inputs
        text = _text(inputs["text_input"].reshape(-1)[0])
        streaming = bool(_flag(inputs, "stream"))
        exclude = _flag(inputs, "exclude_input_in_output")
        prepend = (not exclude) if exclude is not None else not streaming
        if prepend and streaming:
            raise invalid_arg("When streaming, `exclude_input_in_output` = False is not allowed.")
        raw = inputs.get("sampling_parameters")
        if raw is not None and raw.size:
            params = parse_sampling_parameters(raw.reshape(-1)[0])
        else:
            # Triton's vLLM backend falls back to the request's parameters.
            given = {
                k: v
                for k, v in job.request.parameters.items()
                if not k.startswith("triton_") and k not in ("headers",)
            }
            params = parse_sampling_parameters(json.dumps(given) if given else None)
        self._check_lora(params.lora_name)
        flags = {name: bool(_flag(inputs, name)) for name in _FLAGS}
        state = _Request(
            stream=stream,
            streaming=streaming,
            prepend=text if prepend else "",
            flags=flags,
            params=params,
            received_ns=job.request.received_ns,
        )
        self._submit(state, self.engine.encode(text), stream)

    def _submit(self, state: _Request, prompt: list[int], stream: ResponseStream) -> None:
        def sink(out: StepOutput) -> None:
            self._send(state, out)

        self.engine.submit(
            prompt, state.params, sink, stream.cancelled, lora_name=state.params.lora_name
        )

    def _check_lora(self, name: str | None) -> None:
        """Triton's vLLM backend's refusals of a `lora_name` (its messages, a 400)."""
        if name is None:
            return
        names = self.engine.lora_names()
        if names is None:
            raise invalid_arg("LoRA feature is not enabled.")
        if name not in names:
            raise invalid_arg(f"LoRA {name} is not supported, we currently support {names}")

    def _send(self, state: _Request, out: StepOutput) -> None:
        """On the engine thread: one step's output becomes a response (streaming) or is kept
        for the final one."""
        now = time.monotonic_ns()
        if out.token_ids:
            if not state.first_ns:
                state.first_ns = now
            state.last_ns = now
        if out.error is not None:
            self._outbox.append((state.stream, None, out.error, True, None))
            return
        if out.prompt_logprobs is not None:
            state.prompt_logprobs = out.prompt_logprobs  # sent with the next response
        if out.logprobs:
            state.logprobs.extend(out.logprobs)
            state.chosen.extend(out.token_ids)
        if state.streaming:
            if not out.text and not out.finished:
                return  # held back (half a UTF-8 character): nothing to say yet
            self._outbox.append(self._response(state, out, out.text))
            state.tokens_sent = out.num_output_tokens
            state.logprobs.clear()
            state.chosen.clear()
            return
        state.pieces.append(out.text)
        if out.finished:
            text = state.prepend + "".join(state.pieces)
            self._outbox.append(self._response(state, out, text))

    def _response(self, state: _Request, out: StepOutput, text: str) -> Send:
        if not state.typed:
            return (state.stream, self._outputs(state, out, text), None, out.finished, None)
        typed = GenerationOutput(
            text=text,
            finish_reason=out.finish_reason if out.finished else None,
            num_input_tokens=out.num_input_tokens,
            num_output_tokens=out.num_output_tokens - state.tokens_sent,
            logprobs=self._logprob_entries(state) if state.params.logprobs is not None else None,
            prompt_logprobs=self._prompt_entries(state),
        )
        state.prompt_logprobs = None
        return (state.stream, {}, None, out.finished, typed)

    def _logprob_entries(self, state: _Request) -> list[list[tuple[str, float]]]:
        """Per token: the chosen token's (text, logprob) first, then the alternatives from the
        most likely down (GenerationOutput.logprobs)."""
        decode = self.engine.tokenizer.decode
        entries = []
        for token, top in zip(state.chosen, state.logprobs, strict=True):
            ranked = sorted(top.items(), key=lambda kv: -kv[1])
            chosen = [(decode([token]), top.get(token, 0.0))]
            entries.append(chosen + [(decode([t]), lp) for t, lp in ranked if t != token])
        return entries

    def _prompt_entries(self, state: _Request) -> list[list[PromptLogprob]] | None:
        """GenerationOutput.prompt_logprobs, from the first step's output."""
        if state.prompt_logprobs is None or state.prompt is None:
            return None
        decode = self.engine.tokenizer.decode
        first = state.prompt[0]
        entries: list[list[PromptLogprob]] = [[(first, decode([first]), None, None)]]
        for step in state.prompt_logprobs:
            entries.append([(t, decode([t]), lp, rank) for t, (lp, rank) in step.items()])
        return entries

    def _outputs(self, state: _Request, out: StepOutput, text: str) -> dict[str, np.ndarray]:
        result: dict[str, np.ndarray] = {
            "text_output": np.array([text.encode("utf-8")], dtype=np.object_)
        }
        flags = state.flags
        if flags["return_finish_reason"]:
            result["finish_reason"] = np.array([str(out.finish_reason).encode()], np.object_)
        if flags["return_cumulative_logprob"]:
            result["cumulative_logprob"] = np.array([out.cumulative_logprob], dtype=np.float32)
        if flags["return_logprobs"]:
            result["logprobs"] = np.array([self._logprobs_json(state).encode()], np.object_)
        if flags["return_num_input_tokens"]:
            result["num_input_tokens"] = np.array([out.num_input_tokens], dtype=np.uint32)
        if flags["return_num_output_tokens"]:
            count = out.num_output_tokens - state.tokens_sent
            result["num_output_tokens"] = np.array([count], dtype=np.uint32)
        return result

    def _logprobs_json(self, state: _Request) -> str:
        """vLLM's layout: per token, {token_id: {logprob, rank, decoded_token}}, the sampled
        token first (as vLLM's dicts begin with it), then the others by rank; "null" when the
        sampling parameters asked for none."""
        if state.params.logprobs is None:
            return "null"
        tokenizer = self.engine.tokenizer
        tokens: list[dict[str, dict[str, Any]]] = []
        for chosen, top in zip(state.chosen, state.logprobs, strict=True):
            ranked = sorted(top.items(), key=lambda kv: -kv[1])
            entries = {
                token: {
                    "logprob": logprob,
                    "rank": rank,
                    "decoded_token": tokenizer.decode([token]),
                }
                for rank, (token, logprob) in enumerate(ranked, start=1)
            }
            first = {chosen: entries.pop(chosen)} if chosen in entries else {}
            tokens.append({str(t): entry for t, entry in (first | entries).items()})
        return json.dumps(tokens)
