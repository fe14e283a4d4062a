"""The model configs frontend workers validate requests against, so the core need not (issue 27).

With the rest of the mirrored server state (messages.State) the core sends every worker what
`validate_request` reads of each loaded version: its name, max_batch_size, inputs and outputs,
by model name and version ("" for the highest ready one), with the version's `serial`. A worker
runs `validate_request` on a request it finds a version for and sends that serial with it; the
core skips its checks only when the version it resolves has that very serial, so a mirror that is
out of date (a reload the worker has not heard of yet) costs one check in the core, never a wrong
answer. A request the worker finds invalid goes to the core unmarked, and the core refuses it
with the status and words it always used: errors are never worded in the worker.

For a version that uses the response cache the worker also hashes the request
(prechecks.request_key, the very function the core would run) and sends the key beside the
serial: hashing the inputs is the cache's one cost that grows with the request, and it is paid in
the worker. The core uses the key only with a matching serial, as it does the validation.

For a model whose engine takes typed requests (the core's GenerationInfo: the built-in LLM
engine), the workers also get what the OpenAI routes read of it (`Generating`), so that a worker
renders the chat template, tokenizes and plans the request itself and sends the core token ids.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from oceanus.core import datatypes
from oceanus.core.model import ModelVersion
from oceanus.core.prechecks import TensorSpec, cacheable, request_key, validate_request
from oceanus.core.server import ServerCore
from oceanus.core.types import InferRequest

# The wire form of one version: (serial, name, max_batch_size, inputs, outputs, version_str,
# cached), each tensor (name, datatype, dims, optional): plain values, as marshal carries them.
Spec = tuple[Any, ...]


class Generating(NamedTuple):
    """What a worker's OpenAI routes read of a model whose engine takes typed requests."""

    version: int
    path: str
    max_model_len: int
    tokenizer_folder: str
    inputs: tuple[str, ...]
    tool_call_parser: str | None
    reasoning_parser: str | None = None


class Specs:
    """What the workers mirror of `core`: {model name: {version: spec}}, ready versions only.
    Made again only after a version started or stopped (`ModelVersion.changes`): the state is
    read after every call a worker forwards, health probes included."""

    def __init__(self, core: ServerCore) -> None:
        self._core = core
        self._seen = -1
        self._specs: dict[str, dict[str, Spec]] = {}
        self._generating: dict[str, tuple[Any, ...]] = {}

    def __call__(self) -> dict[str, dict[str, Spec]]:
        self._refresh()
        return self._specs

    def generating(self) -> dict[str, tuple[Any, ...]]:
        """{model name: Generating} of the highest ready versions with a GenerationInfo."""
        self._refresh()
        return self._generating

    def _refresh(self) -> None:
        if self._seen != ModelVersion.changes:
            self._seen = ModelVersion.changes
            self._specs = _model_specs(self._core)
            self._generating = _generating(self._core)


def _generating(core: ServerCore) -> dict[str, tuple[Any, ...]]:
    found: dict[str, tuple[Any, ...]] = {}
    for name, entry in core.models.items():
        version = entry.highest_ready()
        info = version.generation_info() if version is not None else None
        if version is None or info is None:
            continue
        parameters = version.config.parameters
        parser = parameters.get("tool_call_parser")
        thinking = parameters.get("reasoning_parser")
        found[name] = tuple(
            Generating(
                version.version,
                str(version.path),
                info.max_model_len,
                str(info.tokenizer_folder),
                tuple(version.inputs),
                parser.string_value if parser is not None else None,
                thinking.string_value if thinking is not None else None,
            )
        )
    return found


def _model_specs(core: ServerCore) -> dict[str, dict[str, Spec]]:
    specs: dict[str, dict[str, Spec]] = {}
    for name, entry in core.models.items():
        versions: dict[str, Spec] = {}
        for version in entry.versions.values():
            if version.ready and not version.decoupled:
                versions[version.version_str] = _spec(version, core.cache_enabled(version))
        highest = entry.highest_ready()
        if highest is not None and highest.version_str in versions:
            versions[""] = versions[highest.version_str]
        if versions:
            specs[name] = versions
    return specs


def _spec(version: ModelVersion, cached: bool) -> Spec:
    def tensors(specs: dict[str, TensorSpec]) -> tuple[Any, ...]:
        return tuple((s.name, s.datatype.name, s.dims, s.optional) for s in specs.values())

    return (
        version.serial,
        version.name,
        version.config.max_batch_size,
        tensors(version.inputs),
        tensors(version.outputs),
        version.version_str,
        cached,
    )


class _Version(NamedTuple):
    serial: int
    name: str
    max_batch_size: int
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    version_str: str
    cached: bool


def _version(spec: Spec) -> _Version:
    serial, name, max_batch_size, inputs, outputs, version_str, cached = spec

    def tensors(wire: tuple[Any, ...]) -> dict[str, TensorSpec]:
        return {
            n: TensorSpec(n, datatypes.BY_NAME[datatype], tuple(dims), optional)
            for n, datatype, dims, optional in wire
        }

    return _Version(
        serial, name, max_batch_size, tensors(inputs), tensors(outputs), version_str, cached
    )


class Mirror:
    """A worker's copy of the loaded versions' configs (empty until the core's first State)."""

    def __init__(self) -> None:
        self._wire: dict[str, Any] = {}
        self._versions: dict[str, dict[str, _Version]] = {}
        # Models whose engine takes typed requests (Specs.generating), by name.
        self.generating: dict[str, Generating] = {}

    def update_generating(self, wire: dict[str, Any]) -> None:
        self.generating = {name: Generating(*fields) for name, fields in wire.items()}

    def update(self, wire: dict[str, Any]) -> None:
        if wire == self._wire:
            return
        self._wire = wire
        self._versions = {
            name: {key: _version(spec) for key, spec in versions.items()}
            for name, versions in wire.items()
        }

    def check(self, request: InferRequest) -> tuple[int, bytes]:
        """The serial of the version `request` passed validate_request for (0: the core checks
        it: no such version here, or the request is refused and the core words the error), and
        its response cache key when that version caches (b"": none)."""
        versions = self._versions.get(request.model_name)
        if versions is None:
            return 0, b""
        version = versions.get(request.model_version)
        if version is None:
            return 0, b""
        try:
            validate_request(
                request, version.name, version.max_batch_size, version.inputs, version.outputs
            )
        except Exception:  # refused (or unreadable): the core's own check answers it
            return 0, b""
        if version.cached and cacheable(request):
            return version.serial, request_key(version.name, version.version_str, request)
        return version.serial, b""
