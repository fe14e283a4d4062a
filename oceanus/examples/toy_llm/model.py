"""A toy language model with the vLLM backend's tensors (a decoupled Python model).

It has no weights: it "generates" deterministically, so tests can tell what a reply must be.
The reply is the text after the prompt's last `SAY:` (up to the end of that turn), token by
token with the model's own tokenizer, then the end-of-sequence token; `SAY:FOREVER` repeats
"la " until max_tokens; `SAY:RUNNING` answers how many other requests it is generating and how
many it stopped on cancellation (a test of a cut stream reads them). With no `SAY:` it answers
"Hello from the toy model.". Honours max_tokens, stop strings, exclude_input_in_output, stream,
the return_* flags and cancellation; logprobs are 0.0 for the chosen token (the model is certain).
"""

import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

import triton_python_backend_utils as pb_utils

END_OF_TURN = "<|im_end|>"
DEFAULT_REPLY = "Hello from the toy model."


def _flag(request: Any, name: str, default: bool = False) -> bool:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else bool(tensor.as_numpy().reshape(-1)[0])


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        folder = Path(args["model_repository"])
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        eos = self.tokenizer.token_to_id(END_OF_TURN)
        assert eos is not None, f"the tokenizer has no {END_OF_TURN}"
        self.eos: int = eos
        self.context = json.loads((folder / "config.json").read_text())["max_position_embeddings"]
        self.delay_s = float(json.loads((folder / "config.json").read_text()).get("delay_s", 0))
        self.running = 0  # requests being generated
        self.cancelled = 0  # generations that stopped because their request was cancelled
        self.lock = threading.Lock()

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            threading.Thread(target=self._generate, args=(request, sender), daemon=True).start()
        return None

    def _reply_ids(self, prompt: str) -> tuple[list[int], bool]:
        marker = prompt.rfind("SAY:")
        if marker < 0:
            return self.tokenizer.encode(DEFAULT_REPLY).ids, False
        text = prompt[marker + 4 :].split(END_OF_TURN)[0].rstrip("\n")
        if text == "FOREVER":
            return self.tokenizer.encode("la ").ids, True
        if text == "RUNNING":
            answer = f"{self.running - 1} running, {self.cancelled} cancelled"
            return self.tokenizer.encode(answer).ids, False
        return self.tokenizer.encode(text).ids, False

    def _generate(self, request: Any, sender: Any) -> None:
        with self.lock:
            self.running += 1
        try:
            self._run(request, sender)
        except Exception as exc:  # the client hears what went wrong
            error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
            sender.send(
                pb_utils.InferenceResponse(error=error),
                pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        finally:
            with self.lock:
                self.running -= 1

    def _run(self, request: Any, sender: Any) -> None:
        text_input = pb_utils.get_input_tensor_by_name(request, "text_input")
        assert text_input is not None  # a required input
        prompt = text_input.as_numpy().reshape(-1)[0]
        prompt = prompt.decode("utf-8") if isinstance(prompt, bytes) else str(prompt)
        stream = _flag(request, "stream")
        exclude_input = _flag(request, "exclude_input_in_output", default=stream)
        parameters = pb_utils.get_input_tensor_by_name(request, "sampling_parameters")
        sampling = {}
        if parameters is not None:
            sampling = json.loads(parameters.as_numpy().reshape(-1)[0])
        prompt_ids = self.tokenizer.encode(prompt).ids
        if len(prompt_ids) > self.context:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens exceeds {self.context}")
        max_tokens = int(sampling.get("max_tokens") or self.context - len(prompt_ids))
        stop = sampling.get("stop") or []
        stop = [stop] if isinstance(stop, str) else list(stop)
        reply, forever = self._reply_ids(prompt)
        flags = {
            name: _flag(request, name)
            for name in (
                "return_finish_reason",
                "return_num_input_tokens",
                "return_num_output_tokens",
                "return_logprobs",
                "return_cumulative_logprob",
            )
        }
        text, finish, position, sent = "", None, 0, 0
        produced: list[int] = []
        pending: list[int] = []  # ids of this response (streaming: one at a time)
        while finish is None:
            if sender.is_cancelled():
                with self.lock:
                    self.cancelled += 1
                return
            if len(produced) >= max_tokens:
                finish = "length"
                break
            if position < len(reply) or forever:
                token = reply[position % len(reply)]
                position += 1
            else:
                token = self.eos
            if token == self.eos:
                finish = "stop"
                break
            produced.append(token)
            pending.append(token)
            text = self.tokenizer.decode(produced)
            cut = [text.find(s) for s in stop if s and s in text]
            if cut:
                text = text[: min(cut)]
                finish = "stop"
                break
            if self.delay_s:
                time.sleep(self.delay_s)
            if stream:
                self._send(sender, prompt_ids, text[sent:], pending, None, flags, False)
                sent, pending = len(text), []
        if stream:
            self._send(sender, prompt_ids, text[sent:], pending, finish, flags, True)
        else:
            out = text if exclude_input else prompt + text
            self._send(sender, prompt_ids, out, produced, finish, flags, True)

    def _send(
        self,
        sender: Any,
        prompt_ids: list[int],
        delta: str,
        ids: list[int],
        finish: str | None,
        flags: Any,
        final: bool,
    ) -> None:
        tensors = [pb_utils.Tensor("text_output", np.array([delta.encode()], dtype=np.object_))]
        if flags["return_finish_reason"]:
            tensors.append(
                pb_utils.Tensor("finish_reason", np.array([str(finish).encode()], dtype=np.object_))
            )
        if flags["return_num_input_tokens"]:
            tensors.append(
                pb_utils.Tensor("num_input_tokens", np.array([len(prompt_ids)], dtype=np.uint32))
            )
        if flags["return_num_output_tokens"]:
            tensors.append(pb_utils.Tensor("num_output_tokens", np.array([len(ids)], np.uint32)))
        if flags["return_logprobs"]:
            steps = [
                {str(t): {"logprob": 0.0, "rank": 1, "decoded_token": self.tokenizer.decode([t])}}
                for t in ids
            ]
            tensors.append(
                pb_utils.Tensor(
                    "logprobs", np.array([json.dumps(steps).encode()], dtype=np.object_)
                )
            )
        if flags["return_cumulative_logprob"]:
            tensors.append(pb_utils.Tensor("cumulative_logprob", np.array([0.0], np.float32)))
        sender.send(
            pb_utils.InferenceResponse(tensors),
            pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0,
        )
