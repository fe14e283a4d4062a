"""LoRA adapters on the CPU engine: several adapters and the base model in one forward pass.

An adapter is peft's folder (`adapter_config.json` + `adapter_model.safetensors`), read here with
safetensors and json (serving needs no peft). Each targeted linear y = W x gains
scale * B (A x) for the rows of the sequences that use the adapter: every linear of the decoder
layers is wrapped once at load (`wrap`), and before each pass the engine says which rows
(flattened tokens) belong to which adapter (`LoraState.set_rows`); a wrapped linear then loops
over the adapters present in the pass and adds each one's delta to its rows only (punica's
gather/scatter, as `index_select` and `index_add_`). Base rows cost nothing extra.

The engine's fused gated MLP (linear.py) runs SiLU and the product inside the gate and up
matmuls, with no place for a delta between them: when an adapter in the pass targets gate or up,
that layer's MLP runs unfused for the pass (`LoraMLP`)."""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from oceanus.backends.llm.linear import FusedMLP, PackedLinear
from oceanus.backends.llm.quant import Int8Linear
from oceanus.core.errors import invalid_arg, not_found

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"


class LoraState:
    """Shared by every wrapped linear of one engine: which adapter each row of this pass runs.

    A linear adds every present adapter's delta in three ops, whatever their number: x @ A_cat
    (the adapters' A^T side by side, `[in, R]`), times a `[rows, R]` mask that keeps each row's
    own adapter's columns, then addmm with B_cat (`[R, out]`). For a pass on one adapter the
    mask is left out. Measured against a gather/scatter loop per adapter
    (bench/results/2026-12-06-llm-lora.md): fewer, larger ops."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.present: tuple[int, ...] = ()  # the adapter ids in this pass, sorted
        self.whole = False  # every row runs the one adapter present: no mask
        self._rows = torch.zeros(0, dtype=torch.long)
        self._masks: dict[tuple[tuple[int, int], ...], torch.Tensor] = {}

    def set_rows(self, adapter_per_row: list[int]) -> None:
        """Before a pass: each flattened token row's adapter id (0: the base model)."""
        present = set(adapter_per_row)
        base = 0 in present
        present.discard(0)
        self.present = tuple(sorted(present))
        self.whole = len(present) == 1 and not base
        self._masks = {}
        if present and not self.whole:
            self._rows = torch.tensor(adapter_per_row, dtype=torch.long)

    def _mask(self, key: tuple[tuple[int, int], ...]) -> torch.Tensor:
        """`[rows, R]`: 1 where the row's adapter owns the column ((id, rank) per adapter)."""
        mask = self._masks.get(key)
        if mask is None:
            owners = torch.tensor([aid for aid, rank in key for _ in range(rank)])
            mask = (self._rows[:, None] == owners[None, :]).to(self.dtype)
            self._masks[key] = mask
        return mask

    def add(self, x: torch.Tensor, out: torch.Tensor, linear: LoraLinear) -> torch.Tensor:
        """`out` (the base linear's output for `x`) plus each present adapter's delta."""
        ids = tuple(aid for aid in self.present if aid in linear.weights)
        if not ids:
            return out
        a_cat, b_cat, key = linear.joined(ids)
        flat_x = x.reshape(-1, x.shape[-1])
        flat = out if out.is_contiguous() else out.contiguous()
        flat = flat.view(-1, flat.shape[-1])
        low = flat_x @ a_cat
        if not self.whole:
            low.mul_(self._mask(key))
        flat.addmm_(low, b_cat)
        return flat.view(out.shape)

    def touches(self, *linears: LoraLinear) -> bool:
        return any(aid in lin.weights for aid in self.present for lin in linears)


class LoraLinear(nn.Module):
    """A linear (plain or oneDNN-packed) plus the deltas of the adapters that target it:
    `weights[id]` = (A^T `[in, r]`, scale * B^T `[r, out]`) in the engine's dtype."""

    def __init__(self, base: nn.Module, state: LoraState) -> None:
        super().__init__()
        self.base = base
        self.state = state
        self.in_features: int = base.in_features  # type: ignore[assignment]
        self.out_features: int = base.out_features  # type: ignore[assignment]
        self.weights: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # The last set of adapters joined (consecutive passes mostly run the same set).
        self._joined: tuple[tuple[int, ...], Any] = ((), None)

    def joined(
        self, ids: tuple[int, ...]
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[tuple[int, int], ...]]:
        """The adapters' A^T side by side and their B^T stacked, and ((id, rank), ...)."""
        if self._joined[0] == ids:
            found: tuple[torch.Tensor, torch.Tensor, tuple[tuple[int, int], ...]] = self._joined[1]
            return found
        pairs = [self.weights[aid] for aid in ids]
        if len(pairs) == 1:
            a_cat, b_cat = pairs[0]
        else:
            a_cat = torch.cat([a for a, _ in pairs], dim=1)
            b_cat = torch.cat([b for _, b in pairs], dim=0)
        key = tuple((aid, a.shape[1]) for aid, (a, _) in zip(ids, pairs, strict=True))
        self._joined = (ids, (a_cat, b_cat, key))
        return a_cat, b_cat, key

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.state.add(x, self.base(x), self)


class LoraMLP(nn.Module):
    """A FusedMLP whose projections take adapters: fused while no adapter of the pass targets
    gate or up (down's delta is added after the fused part), else unfused for the pass."""

    def __init__(self, fused: FusedMLP, state: LoraState) -> None:
        super().__init__()
        self.state = state
        self.gate_proj = LoraLinear(fused.gate_proj, state)
        self.up_proj = LoraLinear(fused.up_proj, state)
        self.down_proj = LoraLinear(fused.down_proj, state)
        self.fused = fused
        fused.down_proj = self.down_proj  # type: ignore[assignment]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.state.touches(self.gate_proj, self.up_proj):
            hidden = nn.functional.silu(self.gate_proj(x)) * self.up_proj(x)
            out: torch.Tensor = self.down_proj(hidden)
            return out
        fused: torch.Tensor = self.fused(x)
        return fused


def wrap(model: nn.Module, state: LoraState) -> dict[str, LoraLinear]:
    """Wrap every linear of the decoder (plain, oneDNN-packed or int8; not the LM head, not
    embeddings: as vLLM's default targets) so adapters can be added at any time; returns them
    by module path."""
    body = model.get_submodule("model") if hasattr(model, "model") else model
    for parent in list(body.modules()):
        if isinstance(parent, (FusedMLP, LoraLinear, LoraMLP)):
            continue  # a fused MLP's projections are wrapped by its LoraMLP
        for name, child in list(parent.named_children()):
            if isinstance(child, FusedMLP):
                setattr(parent, name, LoraMLP(child, state))
            elif type(child) in (nn.Linear, PackedLinear, Int8Linear):
                setattr(parent, name, LoraLinear(child, state))
    return {name: mod for name, mod in model.named_modules() if isinstance(mod, LoraLinear)}


@dataclass
class Adapter:
    name: str
    path: Path
    id: int  # never reused: a reloaded name gets a new id (and prefix-cache entries)
    rank: int
    # Module path -> (A^T, scale * B^T).
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


def read_adapter(name: str, path: Path, adapter_id: int, max_rank: int, dtype: Any) -> Adapter:
    """peft's folder -> an Adapter; raises INVALID_ARG for what is refused (rank above
    `max_lora_rank`, peft features this engine does not run)."""
    from safetensors.torch import load_file

    config_file, weights_file = path / CONFIG, path / WEIGHTS
    if not config_file.is_file():  # vLLM's words (its server answers them with a 404)
        raise not_found(f"No adapter found for {path}")
    if not weights_file.is_file():
        raise invalid_arg(f"LoRA adapter '{name}': {path} has no {WEIGHTS} (peft's format)")
    config = json.loads(config_file.read_text())
    rank, alpha = int(config.get("r", 8)), float(config.get("lora_alpha", 8))
    if rank > max_rank:
        raise invalid_arg(
            f"LoRA adapter '{name}': LoRA rank {rank} is greater than max_lora_rank {max_rank}"
        )
    for key in ("use_dora", "rank_pattern", "alpha_pattern", "modules_to_save"):
        if config.get(key):
            raise invalid_arg(f"LoRA adapter '{name}': peft's '{key}' is not supported")
    if config.get("bias", "none") != "none":
        raise invalid_arg(f"LoRA adapter '{name}': peft's bias '{config['bias']}' is unsupported")
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    tensors = load_file(str(weights_file))
    adapter = Adapter(name, path, adapter_id, rank)
    for key, a in tensors.items():
        if not key.endswith(".lora_A.weight"):
            if not key.endswith(".lora_B.weight"):
                raise invalid_arg(f"LoRA adapter '{name}': unsupported tensor '{key}'")
            continue
        module = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
        b = tensors[key.replace(".lora_A.", ".lora_B.")]
        a_t = a.t().to(dtype).contiguous()
        b_t = (b.float() * scale).t().to(dtype).contiguous()
        adapter.weights[module] = (a_t, b_t)
    return adapter


class Adapters:
    """The engine's adapters by name: loaded, acquired by sequences, and unloaded once the
    last sequence using one ends (an unloaded name is refused to new requests at once)."""

    def __init__(self, model: nn.Module, max_rank: int, max_loras: int, dtype: Any) -> None:
        self.state = LoraState(dtype)
        self.linears = wrap(model, self.state)
        self.max_rank = max_rank
        self.max_loras = max_loras
        self.dtype = dtype
        self._lock = threading.Lock()
        self._next = 1
        self.by_name: dict[str, Adapter] = {}
        self._users: dict[int, int] = {}
        self._retired: dict[int, Adapter] = {}

    def load(self, name: str, path: str | Path) -> Adapter:
        path = Path(path)
        with self._lock:
            if name in self.by_name:
                raise invalid_arg(f"The lora adapter '{name}' has already been loaded.")
            adapter_id = self._next
            self._next += 1
        adapter = read_adapter(name, path, adapter_id, self.max_rank, self.dtype)
        for module in adapter.weights:
            if module not in self.linears:
                raise invalid_arg(
                    f"LoRA adapter '{name}': target module '{module}' is not a linear of "
                    "this model's decoder layers"
                )
        with self._lock:
            if name in self.by_name:
                raise invalid_arg(f"The lora adapter '{name}' has already been loaded.")
            for module, pair in adapter.weights.items():
                self.linears[module].weights[adapter_id] = pair
            self.by_name[name] = adapter
        return adapter

    def unload(self, name: str) -> None:
        with self._lock:
            adapter = self.by_name.pop(name, None)
            if adapter is None:
                raise not_found(f"The lora adapter '{name}' cannot be found.")
            if self._users.get(adapter.id):
                self._retired[adapter.id] = adapter  # dropped when its last sequence ends
            else:
                self._drop(adapter)

    def acquire(self, name: str) -> int:
        with self._lock:
            adapter = self.by_name.get(name)
            if adapter is None:
                raise not_found(f"The model `{name}` does not exist.")
            self._users[adapter.id] = self._users.get(adapter.id, 0) + 1
            return adapter.id

    def release(self, adapter_id: int) -> None:
        with self._lock:
            left = self._users.get(adapter_id, 0) - 1
            if left > 0:
                self._users[adapter_id] = left
                return
            self._users.pop(adapter_id, None)
            retired = self._retired.pop(adapter_id, None)
            if retired is not None:
                self._drop(retired)

    def _drop(self, adapter: Adapter) -> None:
        for module in adapter.weights:
            self.linears[module].weights.pop(adapter.id, None)

    def names(self) -> list[str]:
        with self._lock:
            return list(self.by_name)

    def adapters(self) -> dict[str, str]:
        """Name -> folder (core.generation.LoraAdapters)."""
        with self._lock:
            return {name: str(adapter.path) for name, adapter in self.by_name.items()}

    def name_of(self, adapter_id: int) -> str:
        with self._lock:
            for adapter in [*self.by_name.values(), *self._retired.values()]:
                if adapter.id == adapter_id:
                    return adapter.name
        return ""
