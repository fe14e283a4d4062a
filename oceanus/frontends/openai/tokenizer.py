"""Each model's own tokenizer and chat template, read from its folder (Hugging Face files).

Where the files are: the model's version folder, its model folder, then the folder that
`model.json` names as `tokenizer` or `model` (a vLLM folder), then an ensemble's composing
models. `tokenizer.json` is read with the `tokenizers` library (no transformers import on the
request path); `tokenizer_config.json` gives the chat template, the special tokens and
`model_max_length`; the context length is `model.json`'s `max_model_len`, else `config.json`'s
`max_position_embeddings`, else `model_max_length`; for the built-in engine, the tokenizer
folder and the context length it published (the core's GenerationInfo) come first. The
template is rendered in a sandboxed jinja2 environment with the helpers transformers gives
templates (`raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII and does not
escape HTML).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from oceanus.frontends.openai.errors import OpenAIError, bad_request

# A model_max_length this large is transformers' "no limit" sentinel.
_NO_LIMIT = 10**12


@dataclass
class ModelTokenizer:
    tokenizer: Any  # tokenizers.Tokenizer
    chat_template: str | None
    special: dict[str, str]  # bos_token, eos_token, ... as text
    context_length: int | None
    folder: Path
    _template: Any = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """`add_special_tokens`: what the tokenizer's post-processor adds (a BOS): vLLM adds
        them to a completion's prompt, never to a rendered chat template (which writes its own)."""
        # encode_batch gives the same ids as encode, but lets go of the GIL while it works, so
        # the event loop runs while a worker thread tokenizes a long prompt.
        encoded = self.tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)
        return list(encoded[0].ids)

    @property
    def vocab_size(self) -> int:
        """Token ids run below this (added and special tokens included)."""
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[Any] | None,
        add_generation_prompt: bool = True,
    ) -> str:
        if not self.chat_template:
            raise bad_request(
                "this model has no chat template (tokenizer_config.json 'chat_template'); "
                "use /v1/completions or start the server with --chat-template"
            )
        if self._template is None:
            self._template = _environment().from_string(self.chat_template)
        try:
            return str(
                self._template.render(
                    messages=messages,
                    tools=tools,
                    add_generation_prompt=add_generation_prompt,
                    **self.special,
                )
            )
        except OpenAIError:
            raise
        except Exception as exc:  # a template's raise_exception() or a message it cannot take
            raise bad_request(f"the chat template failed on these messages: {exc}") from None


def _raise(message: str) -> None:
    raise bad_request(message)


def _tojson(value: Any, indent: int | None = None, **_: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _environment() -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def _read_json(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return document if isinstance(document, dict) else {}


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def candidate_folders(version_dir: Path, model_dir: Path) -> list[Path]:
    """Where a model's tokenizer may be, in order (see the module docstring)."""
    folders = [version_dir, model_dir]
    engine_args = _read_json(version_dir / "model.json")
    for key in ("tokenizer", "model"):
        named = engine_args.get(key)
        if isinstance(named, str) and named:
            path = Path(named)
            for base in (path,) if path.is_absolute() else (version_dir / path, model_dir / path):
                if base.is_dir():
                    folders.append(base)
    return folders


def load_tokenizer(
    folders: Sequence[Path], chat_template: str | None, max_model_len: int | None
) -> ModelTokenizer | None:
    """The first folder's tokenizer that has `tokenizer.json` (None: no folder has one)."""
    for folder in folders:
        path = folder / "tokenizer.json"
        if not path.is_file():
            continue
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise OpenAIError(
                500,
                "reading a model's tokenizer needs the 'tokenizers' package: "
                "pip install 'oceanus[openai]'",
            ) from None
        config = _read_json(folder / "tokenizer_config.json")
        special = {
            key: text
            for key in ("bos_token", "eos_token", "pad_token", "unk_token")
            if (text := _token_text(config.get(key))) is not None
        }
        template = chat_template or config.get("chat_template")
        if isinstance(template, list):  # several named templates: the default one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        if template is None and (folder / "chat_template.jinja").is_file():
            template = (folder / "chat_template.jinja").read_text()
        context = max_model_len or _read_json(folder / "config.json").get("max_position_embeddings")
        if not isinstance(context, int):
            limit = config.get("model_max_length")
            context = limit if isinstance(limit, int) and limit < _NO_LIMIT else None
        return ModelTokenizer(
            Tokenizer.from_file(str(path)),
            template if isinstance(template, str) else None,
            special,
            context,
            folder,
        )
    return None


def max_model_len(version_dir: Path) -> int | None:
    """model.json's `max_model_len`, else the named folder's `max_position_embeddings` (what
    vLLM lists for an embedding model or a cross-encoder)."""
    value = _read_json(version_dir / "model.json").get("max_model_len")
    if isinstance(value, int) and value > 0:
        return value
    for folder in candidate_folders(version_dir, version_dir.parent)[2:]:
        found = _read_json(folder / "config.json").get("max_position_embeddings")
        if isinstance(found, int) and found > 0:
            return found
    return None


def read_chat_template(option: str) -> str:
    """`--chat-template`: a file's path, or the template itself."""
    path = Path(option)
    try:
        if path.is_file():
            return path.read_text()
    except OSError:
        pass
    return option
