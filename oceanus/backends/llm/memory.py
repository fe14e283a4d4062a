"""The KV cache's memory budget (no torch: both engines' schedulers read it).

The budget is bytes, named as vLLM names it: model.json's `kv_cache_memory_bytes` (vLLM's
CacheConfig field), else the environment's `VLLM_CPU_KVCACHE_SPACE` in GiB (what vLLM's CPU
build reads), else 4 GiB (vLLM's CPU default before it sized the cache from the machine), or
half the memory available at load where that is less. The default engine allocates cells as
sequences grow (kv_cache.py), so the budget is a ceiling, not what a loaded model holds; the
tokens it buys bound admission (reservations of prompt + max_tokens), with `kv_cache_tokens`
as a further cap."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from oceanus.backends.llm.args import EngineArgs
from oceanus.core.errors import invalid_arg

GiB = 1 << 30
DEFAULT_BYTES = 4 * GiB
ENV = "VLLM_CPU_KVCACHE_SPACE"
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2}


def kv_dtype(args: EngineArgs) -> str:
    """The KV cache's element type: `kv_cache_dtype`, "auto" being the model's dtype."""
    return args.dtype if args.kv_cache_dtype == "auto" else args.kv_cache_dtype


def bytes_per_token(config: Any, dtype: str) -> int:
    """Keys and values of one token over every layer."""
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    return 2 * int(config.num_hidden_layers) * kv_heads * head_dim * ELEMENT_BYTES[dtype]


def available_bytes() -> int | None:
    """Memory this process may still take: /proc/meminfo's MemAvailable, less where a cgroup
    (a container) limits it; None where neither can be read."""
    found: list[int] = []
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as limit_file:
            limit = limit_file.read().strip()
        if limit != "max":
            with open("/sys/fs/cgroup/memory.current") as current:
                found.append(max(0, int(limit) - int(current.read().strip())))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def human(size: float) -> str:
    return f"{size / GiB:.2f} GiB" if size >= GiB else f"{size / 2**20:.0f} MiB"


def budget_bytes(args: EngineArgs, available: int | None) -> tuple[int, str]:
    """The budget in bytes and where it came from."""
    if args.kv_cache_memory_bytes is not None:
        return args.kv_cache_memory_bytes, "model.json kv_cache_memory_bytes"
    space = os.environ.get(ENV, "").strip()
    if space:
        try:
            gib = float(space)
        except ValueError:
            gib = -1.0
        if gib <= 0:
            raise invalid_arg(f"{ENV} must be a positive number of GiB, got {space!r}")
        return int(gib * GiB), f"{ENV}={space}"
    if available is not None and available // 2 < DEFAULT_BYTES:
        return available // 2, f"default: half the {human(available)} available at load"
    return DEFAULT_BYTES, "default: 4 GiB, vLLM's CPU default"


@dataclass(frozen=True)
class KvBudget:
    bytes: int
    source: str  # where `bytes` came from
    dtype: str  # the cache's element type
    per_token: int  # bytes
    tokens: int  # what admission may reserve

    def describe(self) -> str:
        return (
            f"KV cache budget {human(self.bytes)} ({self.source}) = {self.tokens:,} tokens at "
            f"{self.per_token:,} bytes ({self.dtype})"
        )


def kv_budget(
    args: EngineArgs,
    config: Any,
    max_len: int,
    slots: int,
    available: int | None = None,
) -> KvBudget:
    """The budget for this engine; INVALID_ARG when it cannot hold one sequence of
    `max_len` tokens (as vLLM refuses a max_model_len its KV cache cannot hold)."""
    dtype = kv_dtype(args)
    per_token = bytes_per_token(config, dtype)
    size, source = budget_bytes(args, available_bytes() if available is None else available)
    fits = size // per_token
    if fits < max_len:
        raise invalid_arg(
            f"the KV cache budget of {human(size)} ({source}) holds {fits:,} tokens of "
            f"{per_token:,} bytes ({dtype}); one sequence of max_model_len {max_len:,} needs "
            f"{human(max_len * per_token)}: set model.json's 'max_model_len' to at most "
            f"{fits:,}, or raise 'kv_cache_memory_bytes' (or {ENV}, in GiB)"
        )
    tokens = min(fits, slots * max_len)  # more than every slot full could never be used
    if args.kv_cache_tokens is not None:
        tokens = min(tokens, max(args.kv_cache_tokens, max_len))
    return KvBudget(bytes=size, source=source, dtype=dtype, per_token=per_token, tokens=tokens)
