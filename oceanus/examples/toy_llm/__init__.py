"""`write_toy_llm(repository)`: a model folder that generates through the vLLM backend's
tensors without an engine (model.py beside this file), with a tokenizer and chat template.

The OpenAI frontend's tests run against it on any install with `tokenizers`; the language-model
engine's folders (issue 25) are served through the same tensors.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from oceanus.examples.tokenizer import write_tokenizer

CONTEXT_LENGTH = 256

_INPUTS = [
    ("text_input", "TYPE_STRING", "[ 1 ]", False),
    ("stream", "TYPE_BOOL", "[ 1 ]", True),
    ("sampling_parameters", "TYPE_STRING", "[ 1 ]", True),
    ("exclude_input_in_output", "TYPE_BOOL", "[ 1 ]", True),
    ("return_finish_reason", "TYPE_BOOL", "[ 1 ]", True),
    ("return_cumulative_logprob", "TYPE_BOOL", "[ 1 ]", True),
    ("return_logprobs", "TYPE_BOOL", "[ 1 ]", True),
    ("return_num_input_tokens", "TYPE_BOOL", "[ 1 ]", True),
    ("return_num_output_tokens", "TYPE_BOOL", "[ 1 ]", True),
]
_OUTPUTS = [
    ("text_output", "TYPE_STRING", "[ -1 ]"),
    ("finish_reason", "TYPE_STRING", "[ -1 ]"),
    ("cumulative_logprob", "TYPE_FP32", "[ -1 ]"),
    ("logprobs", "TYPE_STRING", "[ -1 ]"),
    ("num_input_tokens", "TYPE_UINT32", "[ 1 ]"),
    ("num_output_tokens", "TYPE_UINT32", "[ -1 ]"),
]


def _config(name: str) -> str:
    inputs = ",\n".join(
        f'  {{ name: "{n}" data_type: {t} dims: {d}{" optional: true" if o else ""} }}'
        for n, t, d, o in _INPUTS
    )
    outputs = ",\n".join(f'  {{ name: "{n}" data_type: {t} dims: {d} }}' for n, t, d in _OUTPUTS)
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
        "model_transaction_policy { decoupled: true }\n"
        f"input [\n{inputs}\n]\noutput [\n{outputs}\n]\n"
    )


def write_toy_llm(repository: Path, name: str = "toy_llm", delay_s: float = 0.0) -> Path:
    """Write the model folder `repository/name` (replacing one there); returns it.

    `delay_s`: a pause after each token (streams a test can cut while they run)."""
    folder = repository / name
    if folder.exists():
        shutil.rmtree(folder)
    (folder / "1").mkdir(parents=True)
    shutil.copyfile(Path(__file__).with_name("model.py"), folder / "1" / "model.py")
    (folder / "config.pbtxt").write_text(_config(name))
    write_tokenizer(folder)
    config = {"max_position_embeddings": CONTEXT_LENGTH, "delay_s": delay_s}
    (folder / "config.json").write_text(json.dumps(config))
    return folder
