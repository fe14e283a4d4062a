"""Triton's response cache with its `local` implementation (docs/response-cache.md).

A request to a model whose config has `response_cache { enable: true }` is hashed (model name and
version, each input's name, datatype, shape and bytes, the outputs asked for and the request's
own parameters) before it is queued. A hit answers from the cache without executing the model; a
miss runs normally and, once it succeeded, stores copies of the response's outputs. Entries are
evicted least recently used first to keep the total of their bytes within the configured size;
a response larger than the whole cache is not stored.

Everything runs on the event loop (lookups before queueing, insertions when the future
resolves), so no locks are needed. Protocol-agnostic: requests and responses are the core's types.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from oceanus.core.tensor_bytes import array_to_bytes
from oceanus.core.types import InferRequest, InferResponse, Tensor

if TYPE_CHECKING:
    from oceanus.core.model import ModelVersion

# Request parameters that change how a request is scheduled or sent, never what the model
# computes: left out of the hash.
_SCHEDULING_PARAMETERS = frozenset(
    {
        "priority",
        "timeout",
        "binary_data_output",
        "triton_enable_empty_final_response",
        "sequence_id",
        "sequence_start",
        "sequence_end",
    }
)

# What one stored entry costs besides its tensor bytes (names, shapes, bookkeeping), so a cache of
# many tiny responses is still bounded.
ENTRY_OVERHEAD = 64


@dataclass(slots=True)
class CachedResponse:
    outputs: list[Tensor]
    parameters: dict[str, Any]
    nbytes: int


@dataclass
class CacheSettings:
    """`--cache-config <name>,<key>=<value>` pairs, by cache name."""

    caches: dict[str, dict[str, str]] = field(default_factory=dict)

    def local_size(self) -> int:
        """The `local` cache's size in bytes (0: no cache)."""
        return int(self.caches.get("local", {}).get("size", "0") or 0)


def parse_cache_config(items: list[str], byte_size: int | None = None) -> CacheSettings:
    """Triton's `--cache-config` values (`local,size=1048576`, repeatable) and the deprecated
    `--response-cache-byte-size N` (the same as `local,size=N`). Raises ValueError."""
    caches: dict[str, dict[str, str]] = {}
    for item in items:
        name, sep, setting = item.partition(",")
        key, eq, value = setting.partition("=")
        name, key, value = name.strip(), key.strip(), value.strip()
        if not name or not sep or not eq or not key:
            raise ValueError(f"--cache-config expects <cache name>,<key>=<value>, got '{item}'")
        caches.setdefault(name, {})[key] = value
    if byte_size is not None:
        if caches:
            raise ValueError(
                "Incompatible flags --response-cache-byte-size and --cache-config both provided. "
                "Please provide one or the other."
            )
        caches["local"] = {"size": str(byte_size)}
    local = caches.get("local")
    if local is not None:
        size = local.get("size")
        if size is None:
            raise ValueError("--cache-config local requires size=<bytes>")
        try:
            if int(size) < 0:
                raise ValueError
        except ValueError:
            raise ValueError(f"invalid cache size '{size}': expected bytes (an integer)") from None
    return CacheSettings(caches)


class ResponseCache:
    """Triton's `local` cache: LRU by total bytes, shared by every model that enables caching."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.used = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self._entries: OrderedDict[bytes, CachedResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    # ---- the store --------------------------------------------------------------------------

    def lookup(self, key: bytes) -> CachedResponse | None:
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry

    def insert(self, key: bytes, outputs: list[Tensor], parameters: dict[str, Any]) -> bool:
        """Store copies of a response's outputs; False when it is larger than the cache."""
        copies = [Tensor(t.name, t.datatype, tuple(t.shape), np.array(t.data)) for t in outputs]
        nbytes = ENTRY_OVERHEAD + sum(_tensor_bytes(t) for t in copies)
        if nbytes > self.size:
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self.used -= old.nbytes
        while self._entries and self.used + nbytes > self.size:
            _, evicted = self._entries.popitem(last=False)
            self.used -= evicted.nbytes
            self.evictions += 1
        self._entries[key] = CachedResponse(copies, dict(parameters), nbytes)
        self.used += nbytes
        return True

    # ---- requests ---------------------------------------------------------------------------

    def infer(self, model: ModelVersion, request: InferRequest) -> asyncio.Future[InferResponse]:
        """Answer `request` to `model` from the cache, or run it and store its response."""
        start = time.monotonic_ns()
        if request.cache_key and request.checked == model.serial:
            key = request.cache_key  # hashed by the frontend worker that validated it
        else:
            key = request_key(model.name, model.version_str, request)
        entry = self.lookup(key)
        if entry is not None:
            response = _response(model, request, entry)
            end = time.monotonic_ns()
            model.stats.record_cache_hit(
                request_ns=end - request.received_ns,
                queue_ns=start - request.received_ns,
                hit_ns=end - start,
            )
            future: asyncio.Future[InferResponse] = asyncio.get_running_loop().create_future()
            future.set_result(response)
            return future
        lookup_ns = time.monotonic_ns() - start
        future = model.infer(request)  # invalid requests raise here, counted nowhere
        future.add_done_callback(lambda done: self._store(model, key, lookup_ns, done))
        return future

    def _store(
        self,
        model: ModelVersion,
        key: bytes,
        lookup_ns: int,
        future: asyncio.Future[InferResponse],
    ) -> None:
        """A miss finished: a success is stored and counted as a miss (lookup + insertion)."""
        if future.cancelled() or future.exception() is not None:
            return
        response = future.result()
        start = time.monotonic_ns()
        self.insert(key, response.outputs, response.parameters)
        model.stats.record_cache_miss(lookup_ns + time.monotonic_ns() - start)


def cacheable(request: InferRequest) -> bool:
    """Whether a request may use the cache: not when an output goes to shared memory."""
    return request.outputs is None or all(o.shm is None for o in request.outputs)


def request_key(model_name: str, version: str, request: InferRequest) -> bytes:
    """The hash a request is cached under."""
    digest = hashlib.blake2b(digest_size=16)

    def part(value: str | bytes | memoryview) -> None:
        data = value.encode() if isinstance(value, str) else bytes(value)
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)

    part(model_name)
    part(version)
    for tensor in sorted(request.inputs, key=lambda t: t.name):
        part(tensor.name)
        part(tensor.datatype)
        part(",".join(str(d) for d in tensor.shape))
        part(_data_bytes(tensor.data, tensor.datatype))
    if request.outputs is None:
        part("*")
    else:
        part("\0".join(sorted(o.name for o in request.outputs)))
    params = sorted(
        (k, repr(v)) for k, v in request.parameters.items() if k not in _SCHEDULING_PARAMETERS
    )
    part(repr(params))
    return digest.digest()


def _data_bytes(array: np.ndarray, datatype: str) -> bytes | memoryview:
    if array.dtype == object or datatype == "BYTES":
        return array_to_bytes(array, "BYTES")
    return np.ascontiguousarray(array).tobytes()


def _tensor_bytes(tensor: Tensor) -> int:
    data = tensor.data
    if data.dtype == object:
        return len(array_to_bytes(data, "BYTES"))
    return int(data.nbytes)


def _response(model: ModelVersion, request: InferRequest, entry: CachedResponse) -> InferResponse:
    """A new response for `request` (its own id and output parameters) from a cached one."""
    requested = None if request.outputs is None else {o.name: o for o in request.outputs}
    return InferResponse(
        model_name=model.name,
        model_version=model.version_str,
        id=request.id,
        outputs=[Tensor(t.name, t.datatype, t.shape, t.data) for t in entry.outputs],
        requested=requested,
        parameters=dict(entry.parameters),
    )
