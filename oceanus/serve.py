"""`oceanus serve MODEL [flags]`: one language model served as `vllm serve` serves it, with
vLLM's common flags (serve_settings.py), so a launch line or a manifest written for vLLM works
after swapping the image and the command (docs/vllm-compat.md).

MODEL is a Hugging Face folder. A model repository for it is written in a temporary folder (the
layout of Triton's vLLM backend: `config.pbtxt` with backend "vllm" and the tool-call and
reasoning parsers, `1/model.json` with the engine's keys), and the ordinary server runs it in one
process with one port: the OpenAI routes, `GET /health`, `GET /metrics` (vLLM's `vllm:*` gauges
and counters, and Triton's families) and the KServe routes. No gRPC port, no metrics port.
`--api-key` guards the paths vLLM's guards (`/v1`, `/v2` but KServe's health probes): without
`Authorization: Bearer KEY`, a 401 in OpenAI's error shape, which OpenAI clients read
(vLLM's body is `{"error": "Unauthorized"}`; both are the clients' AuthenticationError).

The names the clients ask for (`--served-model-name`, default MODEL as given, e.g.
"/mnt/models" or "Qwen/Qwen3-0.6B") need not be folder names: the OpenAI routes see the model
under each of them (`ServedNames`), the repository holds it under a folder-safe name.
"""

from __future__ import annotations

import argparse
import hmac
import json
import logging
import re
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from prometheus_client.registry import CollectorRegistry

from oceanus import __version__
from oceanus.cli import add_settings
from oceanus.core.types import InferRequest, InferResponse
from oceanus.declaration import declared
from oceanus.frontends.http.protocol import Handler, HttpRequest, HttpResponse, Pending, Streamed
from oceanus.frontends.metrics import MetricsConfig, TritonCollector
from oceanus.frontends.metrics.exposition import CONTENT_TYPE, render
from oceanus.frontends.openai import OpenAIFrontend
from oceanus.frontends.openai.errors import OpenAIError
from oceanus.main import Server
from oceanus.serve_settings import GROUPS, ServeSettings
from oceanus.settings import Settings

log = logging.getLogger("oceanus.serve")

# vLLM flags that take no value: accepted and ignored like every flag not declared here, but
# knowing them keeps `--enforce-eager MODEL` from reading MODEL as the flag's value.
BARE_FLAGS = frozenset(
    {
        "--enforce-eager",
        "--enable-prefix-caching",
        "--enable-chunked-prefill",
        "--no-enable-chunked-prefill",
        "--disable-log-requests",
        "--enable-log-requests",
        "--disable-log-stats",
        "--disable-custom-all-reduce",
        "--disable-sliding-window",
        "--disable-frontend-multiprocessing",
        "--enable-sleep-mode",
        "--enable-expert-parallel",
        "--enable-prompt-tokens-details",
        "--enable-force-include-usage",
        "--disable-fastapi-docs",
        "--enable-request-id-headers",
        "--enable-server-load-tracking",
        "--return-tokens-as-token-ids",
        "--disable-uvicorn-access-log",
        "--headless",
        "--fully-sharded-loras",
    }
)


# The paths vLLM's --api-key guards (KServe's /v2/health/* probes stay open here).
GUARDED = ("/v1", "/v2", "/inference", "/cohere")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"oceanus serve: error: {message} (see 'oceanus serve --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="oceanus serve",
        usage="oceanus serve MODEL [flags]",
        description="Serve one language model (a Hugging Face folder) as `vllm serve` does: "
        "the OpenAI API, /health and /metrics on one port. Other vLLM flags (GPU-only ones "
        "such as --tensor-parallel-size) are accepted and ignored.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"oceanus {__version__}")
    parser.add_argument("model_tag", nargs="?", default=None, help=argparse.SUPPRESS)
    add_settings(parser, ServeSettings, GROUPS)
    return parser


def parse_args(argv: Sequence[str]) -> tuple[ServeSettings, list[str]]:
    """The settings, and the flags given that are not served here (ignored, logged)."""
    parser = build_parser()
    known = {flag for _, item in declared(ServeSettings) for flag in item.flags}
    known |= {"--help", "-h", "--version"}
    kept: list[str] = []
    ignored: list[str] = []
    args = list(argv)
    index = 0
    while index < len(args):
        token = args[index]
        name = token.split("=", 1)[0]
        if token.startswith("--") and name not in known:
            ignored.append(name)
            value_follows = (
                "=" not in token
                and name not in BARE_FLAGS
                and index + 1 < len(args)
                and not args[index + 1].startswith("-")
            )
            index += 2 if value_follows else 1
            continue
        kept.append(token)
        index += 1
    values = vars(parser.parse_args(kept))
    tag = values.pop("model_tag")
    if tag and values["model"] and tag != values["model"]:
        parser.error(f"two models given: '{tag}' and --model '{values['model']}'")
    values["model"] = tag or values["model"]
    if not values["model"]:
        parser.error("no MODEL given: oceanus serve MODEL [flags]")
    return ServeSettings(**values), ignored


def folder_name(served: str) -> str:
    """A repository folder name for a served name ("Qwen/Qwen3-0.6B" -> "Qwen--Qwen3-0.6B")."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "--", served.replace("/", "--")).strip("-.")
    return name or "model"


def model_json(settings: ServeSettings) -> dict[str, Any]:
    """model.json's keys for the flags (vLLM's engine argument names; args.py reads them)."""
    model = Path(settings.model).expanduser()
    document: dict[str, Any] = {
        "model": str(model.resolve()) if model.is_dir() else settings.model,
        "served_model_name": settings.served_model_name[0],
        "dtype": settings.dtype,
        "generation_config": settings.generation_config,
    }
    if settings.tokenizer:
        tokenizer = Path(settings.tokenizer).expanduser()
        document["tokenizer"] = str(tokenizer.resolve()) if tokenizer.is_dir() else str(tokenizer)
    keys = ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "seed", "quantization")
    for key in (*keys, "engine"):
        value = getattr(settings, key)
        if value is not None:
            document[key] = value
    if settings.trust_remote_code:
        document["trust_remote_code"] = True
    for key in ("runner", "task"):  # args.py checks them
        if getattr(settings, key) != "auto":
            document[key] = getattr(settings, key)
    if settings.no_enable_prefix_caching:
        document["enable_prefix_caching"] = False
    if settings.kv_cache_dtype.startswith("fp8"):
        log.warning("--kv-cache-dtype %s is GPU-only: ignored", settings.kv_cache_dtype)
    elif settings.kv_cache_dtype != "auto":
        document["kv_cache_dtype"] = settings.kv_cache_dtype
    if settings.enable_lora or settings.lora_modules:
        document["enable_lora"] = settings.enable_lora
        document["lora_modules"] = [lora_module(text) for text in settings.lora_modules]
        for key in ("max_loras", "max_lora_rank"):
            if getattr(settings, key) is not None:
                document[key] = getattr(settings, key)
    return document


def lora_module(text: str) -> dict[str, Any]:
    """One --lora-modules value: `name=path`, or vLLM's JSON form; a relative local folder is
    made absolute (model.json lies elsewhere: it would be read against its version folder)."""
    if text.lstrip().startswith("{"):
        item = json.loads(text)
        if not isinstance(item, dict) or "name" not in item or "path" not in item:
            raise ValueError(f"--lora-modules JSON needs 'name' and 'path': {text}")
    else:
        name, sep, path = text.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--lora-modules expects name=path or JSON, got '{text}'")
        item = {"name": name, "path": path}
    folder = Path(str(item["path"])).expanduser()
    if folder.is_dir():
        item["path"] = str(folder.resolve())
    return item


def write_repository(settings: ServeSettings, root: Path) -> str:
    """The model folder for the settings under `root`; returns its (folder-safe) name."""
    name = folder_name(settings.served_model_name[0])
    folder = root / name
    (folder / "1").mkdir(parents=True)
    parameters = {
        "tool_call_parser": settings.tool_call_parser,
        "reasoning_parser": settings.reasoning_parser,
    }
    lines = [f'name: "{name}"', 'backend: "vllm"']
    for key, value in parameters.items():
        if value:
            lines.append(f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}')
    (folder / "config.pbtxt").write_text("\n".join(lines) + "\n")
    document = model_json(settings)
    (folder / "1" / "model.json").write_text(json.dumps(document, indent=2) + "\n")
    return name


class ServedNames:
    """The core as the OpenAI routes see it under `oceanus serve`: the model answers to each
    served name (and to its folder's); `/v1/models` lists the served names."""

    def __init__(self, core: Any, names: Sequence[str], internal: str) -> None:
        self._core = core
        self._names = list(dict.fromkeys(names))
        self._internal = internal

    def _name(self, name: str) -> str:
        return self._internal if name in self._names else name

    def internal_name(self, name: str) -> str:
        """The repository's name for a served name (a LoRA load's base_model_name)."""
        return self._name(name)

    def public_name(self, name: str) -> str:
        """The first served name for the repository's (a LoRA adapter's parent)."""
        return self._names[0] if name == self._internal else name

    def ready_versions(self) -> list[Any]:
        return list(self._core.ready_versions())

    def ready(self) -> bool:
        return bool(self._core.ready())

    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        index = []
        for item in self._core.repository_index(ready_only):
            if item.get("name") == self._internal:
                index += [{**item, "name": name} for name in self._names]
            else:
                index.append(item)
        return index

    def resolve(self, name: str, version: str = "") -> Any:
        return self._core.resolve(self._name(name), version)

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        return dict(self._core.model_metadata(self._name(name), version))

    def model_config(self, name: str, version: str = "") -> Any:
        return self._core.model_config(self._name(name), version)

    def generation_info(self, name: str, version: str = "") -> Any:
        return self._core.generation_info(self._name(name), version)

    def infer_stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        request.model_name = self._name(request.model_name)
        stream: AsyncIterator[InferResponse] = self._core.infer_stream(request)
        return stream


@dataclass
class ServePort:
    """What the serve port answers before the ordinary routes: vLLM's `GET /health` (200 once
    the model is ready), `GET /metrics`, and the `--api-key` check on `/v1`."""

    core: Any
    routes: Handler
    api_keys: Sequence[str] = ()

    def __post_init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        # Triton's families and the models' custom ones (the engine's vllm:*), no CPU gauges.
        self.registry.register(
            TritonCollector(self.core, MetricsConfig(), None, custom=self.core.custom_metrics)
        )
        self._keys = [key.encode() for key in self.api_keys]

    def handle(self, request: HttpRequest) -> HttpResponse | Pending | Streamed:
        path = request.path.split("?", 1)[0]
        if request.method == "GET" and path == "/health":
            return HttpResponse(200 if self.core.ready() else 503)
        if request.method == "GET" and path == "/metrics":
            body = render(self.registry.collect())
            return HttpResponse(200, body, [(b"content-type", CONTENT_TYPE.encode())])
        guarded = path.startswith(GUARDED) and not path.startswith("/v2/health/")
        if (
            guarded
            and self._keys
            and not self._authorized(request.headers.get(b"authorization", b""))
        ):
            return OpenAIError(401, "Unauthorized", None, "invalid_api_key").response()
        return self.routes(request)

    def _authorized(self, header: bytes) -> bool:
        """vLLM's check: scheme `Bearer` (any case), then one of the keys."""
        scheme, _, given = header.partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        return any(hmac.compare_digest(given, key) for key in self._keys)


class ServeServer(Server):
    """The ordinary server with the serve port's routes and the served names."""

    def __init__(self, settings: Settings, serve: ServeSettings, internal: str) -> None:
        super().__init__(settings)
        self.serve = serve
        self.internal = internal

    def openai_frontend(self, core: Any) -> OpenAIFrontend:
        names = ServedNames(core, self.serve.served_model_name, self.internal)
        return OpenAIFrontend(
            names, self.settings.chat_template, {}, self.settings.http_max_input_size
        )

    def http_handler(self, core: Any, routes: Handler) -> Handler:
        return ServePort(core, routes, self.serve.api_key).handle


def server_settings(serve: ServeSettings, repository: Path) -> Settings:
    """The ordinary server's settings: one process, one port (the serve port)."""
    verbose = serve.log_verbose
    return Settings(
        model_repositories=[str(repository)],
        http_port=serve.port,
        http_address=serve.host,
        allow_grpc=False,
        allow_metrics=False,
        frontend_workers=0,
        chat_template=serve.chat_template,
        log_verbose=verbose,
    )


def main(argv: Sequence[str]) -> int:
    serve, ignored = parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="oceanus-serve-"))
    try:
        try:
            internal = write_repository(serve, root)
        except ValueError as exc:
            sys.stderr.write(f"oceanus serve: error: {exc}\n")
            return 2
        settings = server_settings(serve, root)
        from oceanus.logs import configure
        from oceanus.main import run

        configure(settings.log)
        for flag in ignored:
            log.warning(
                "vLLM flag %s is not used by Oceanus (GPU-only or not served): ignored", flag
            )
        if serve.enable_auto_tool_choice and not serve.tool_call_parser:
            log.info(
                "--enable-auto-tool-choice: tool calls are parsed in the chat template's format"
            )
        log.info(
            "serving %s as %s on %s:%d (model repository %s)",
            serve.model,
            ", ".join(repr(n) for n in serve.served_model_name),
            serve.host,
            serve.port,
            root,
        )
        return run(settings, [], lambda s: ServeServer(s, serve, internal))
    finally:
        shutil.rmtree(root, ignore_errors=True)
