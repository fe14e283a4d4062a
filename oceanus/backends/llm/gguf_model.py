"""A GGUF file as the engine's model (model.json's `model` naming a `.gguf` file).

transformers reads GGUF (with the `gguf` package): `from_pretrained(folder, gguf_file=name)`
builds the model with every weight dequantized to torch (there are no GGUF matmul kernels on
CPU), and the tokenizer and chat template from the file's `tokenizer.*` metadata. The engine
loads both that way. The OpenAI frontend reads a tokenizer folder (`tokenizer.json`,
`tokenizer_config.json`), so the tokenizer read from the file is saved once into a folder beside
it (`<file>.tokenizer/`, or under `$OCEANUS_CACHE_DIR/llm-gguf/` where the file's folder is not
writable) and that folder is what the engine publishes (`EngineArgs.tokenizer`)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import Counter
from pathlib import Path
from typing import Any

log = logging.getLogger("oceanus.backends.llm")

SUFFIX = ".gguf"
_STAMP = "oceanus-gguf-source.json"


def is_gguf(path: Path) -> bool:
    return path.suffix.lower() == SUFFIX and path.is_file()


def _stamp(path: Path) -> dict[str, Any]:
    stat = path.stat()
    return {"file": path.name, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def tokenizer_dir(path: Path) -> Path:
    """Where the tokenizer read from the GGUF file `path` is kept (nothing is written here)."""
    beside = path.parent / f"{path.name}.tokenizer"
    if os.access(path.parent, os.W_OK) or beside.is_dir():
        return beside
    base = Path(os.environ.get("OCEANUS_CACHE_DIR", Path.home() / ".cache" / "oceanus"))
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    return base / "llm-gguf" / f"{path.stem}-{digest}"


def save_tokenizer(path: Path, target: Path, trust_remote_code: bool = False) -> Any:
    """The tokenizer of the GGUF file `path`, saved into `target` (tokenizer.json,
    tokenizer_config.json with the chat template) unless already saved from this very file;
    returns it, loaded from `target`."""
    from transformers import AutoTokenizer

    stamp = _stamp(path)
    stamp_file = target / _STAMP
    current = stamp_file.is_file() and json.loads(stamp_file.read_text()) == stamp
    if not current:
        tokenizer = AutoTokenizer.from_pretrained(
            path.parent, gguf_file=path.name, trust_remote_code=trust_remote_code
        )
        target.mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(target)
        # The frontend reads the template from tokenizer_config.json: keep it there too.
        config_file = target / "tokenizer_config.json"
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        if tokenizer.chat_template and not config.get("chat_template"):
            config["chat_template"] = tokenizer.chat_template
            config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
        stamp_file.write_text(json.dumps(stamp) + "\n")
        log.info("GGUF %s: tokenizer saved to %s", path.name, target)
    return AutoTokenizer.from_pretrained(target, trust_remote_code=trust_remote_code)


def tensor_types(path: Path) -> Counter[str]:
    """How many of the file's tensors are of each GGML type (F32, F16, Q8_0, Q4_K, ...)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    return Counter(tensor.tensor_type.name for tensor in reader.tensors)


def load_model(path: Path, dtype: Any, trust_remote_code: bool = False) -> Any:
    """The causal LM in the GGUF file `path`, its weights dequantized to `dtype`, with a log
    line saying from which types."""
    from transformers import AutoModelForCausalLM

    types = tensor_types(path)
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=dtype, trust_remote_code=trust_remote_code
    )
    found = ", ".join(f"{name} x{count}" for name, count in sorted(types.items()))
    log.info(
        "GGUF %s: tensors %s dequantized to %s on load",
        path.name,
        found,
        str(dtype).removeprefix("torch."),
    )
    return model


# GGML types of 2-D weights and the weight-only quantization the openvino engine keeps them in:
# 8-bit blocks stay int8; 4-bit ones int4; 5- and 6-bit ones int8 (int4 would lose more than
# the file did).
_KEPT_AS = {"Q8_0": "int8", "Q8_1": "int8", "Q8_K": "int8", "Q6_K": "int8", "Q5_0": "int8"}
_KEPT_AS |= {"Q5_1": "int8", "Q5_K": "int8", "Q4_0": "int4", "Q4_1": "int4", "Q4_K": "int4"}


def kept_quantization(path: Path) -> str | None:
    """The weight-only quantization ("int8", "int4") that keeps the GGUF file's quantized
    weights about as small as in the file (its most common quantized type decides); None for
    a float file."""
    quantized = [(count, name) for name, count in tensor_types(path).items() if name in _KEPT_AS]
    return _KEPT_AS[max(quantized)[1]] if quantized else None


def config_of(path: Path, trust_remote_code: bool = False) -> Any:
    """The model's transformers config, read from the GGUF file's metadata."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(
        path.parent, gguf_file=path.name, trust_remote_code=trust_remote_code
    )
