"""The KV cache: a pool that transformers' attention layers write into, grown as sequences
grow, within the engine's memory budget (memory.py), so that sequences of different lengths
decode in one batched forward pass.

Each running sequence (a slot) owns one contiguous range of the pool's cells: per layer the pool
is `[kv_heads, size, head_dim]` for keys and the same for values, one tensor
`[layers, 2, kv_heads, size, head_dim]` in all. A sequence's cells for one head lie one after
another, so the attention reads a sequence as a view (`narrow`), never a gather, and one
`index_copy_` per layer writes every new key of a pass. A range grows in steps of `block`
tokens (at least a quarter of what it holds, so copies stay linear in the length): in place
when the cells after it are free, else it moves to a free gap, else the pool grows (by half,
up to `max_tokens`, the budget's tokens), else the pool is compacted. A range never grows past
its sequence's reservation (prompt + max_tokens, which admission keeps within the budget), so
the pool never needs more than the budget. Freed ranges are reused; the pool shrinks when its
upper half is free and is released when no sequence runs. So a loaded model holds no KV cells,
and a short chat holds what it wrote, not `max_model_len`.

Before a forward pass the engine `reserve`s each sequence's cells and `bind`s the cells the new
tokens take. In a `whole` pass (attention.py's per-sequence attention) `update` returns the
layer's whole pool as it is stored, and the attention cuts each sequence's cells by its offset
and length (and widens them to the model's dtype when `kv_cache_dtype` differs); otherwise it
gathers `[batch, kv_heads, kv_len, head_dim]` for transformers' attention under the engine's
mask, cells beyond a sequence's length being masked.

The cache may hold another dtype than the model computes in (model.json's `kv_cache_dtype`):
new keys are rounded to it as they are written."""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache


class SlotCache(Cache):
    def __init__(
        self,
        layers: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        max_tokens: int,
        block: int = 16,
    ) -> None:
        super().__init__(layers=[])
        self.num_layers = layers
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.max_tokens = max_tokens  # the budget's tokens: the pool's ceiling
        self.block = max(1, block)
        self.token_bytes = 2 * layers * kv_heads * head_dim * torch.finfo(dtype).bits // 8
        self.size = 0  # the pool's cells per head
        self._pool = torch.zeros(0)
        self.keys: list[torch.Tensor] = []  # per layer `[1, kv_heads, size, head_dim]` views
        self.values: list[torch.Tensor] = []
        self._resize(0)
        self._ranges: dict[int, tuple[int, int]] = {}  # slot -> (first cell, cells held)
        self.moves = 0  # ranges moved to another place (tests, the load log)
        self.resizes = 0
        self.compactions = 0
        # The next pass: where its new keys go in a layer's flat `[heads * size, dim]` view, and
        # (not whole) the cells it reads.
        self._write = torch.zeros(0, dtype=torch.long)
        self._gather: torch.Tensor | None = None  # `[batch, kv_len]` cells
        self._read: torch.Tensor | None = None  # `[kv]` cells of a packed pass
        self._kv_len = 0
        self._whole = False

    # ---- the pool ------------------------------------------------------------------------------

    @property
    def allocated_bytes(self) -> int:
        return self.size * self.token_bytes

    @property
    def held_tokens(self) -> int:
        return sum(cells for _, cells in self._ranges.values())

    def offset(self, slot: int) -> int:
        return self._ranges[slot][0]

    def _resize(self, size: int) -> None:
        """A pool of `size` cells per head holding the cells below `size` of the old one."""
        pool = torch.zeros(
            (self.num_layers, 2, self.kv_heads, size, self.head_dim), dtype=self.dtype
        )
        keep = min(self.size, size)
        if keep:
            pool[:, :, :, :keep].copy_(self._pool[:, :, :, :keep])
        self._pool = pool
        self.size = size
        self.keys = [pool[layer, 0][None] for layer in range(self.num_layers)]
        self.values = [pool[layer, 1][None] for layer in range(self.num_layers)]

    def _move(self, source: int, target: int, cells: int) -> None:
        if source == target or not cells:
            return
        pool = self._pool
        moved = pool[:, :, :, source : source + cells]
        if abs(source - target) < cells:  # overlapping
            moved = moved.clone()
        pool[:, :, :, target : target + cells].copy_(moved)
        self.moves += 1

    def _round(self, cells: int) -> int:
        return -(-cells // self.block) * self.block

    def _others(self, slot: int) -> list[tuple[int, int]]:
        return sorted(r for s, r in self._ranges.items() if s != slot)

    def _gap(self, want: int, slot: int) -> int | None:
        """The first free run of `want` cells inside the pool, `slot`'s own cells not counted
        as free."""
        at = 0
        for start, cells in sorted(self._ranges.values()):
            if start - at >= want:
                return at
            at = max(at, start + cells)
        return at if self.size - at >= want else None

    def reserve(self, slot: int, need: int, limit: int) -> None:
        """Make `slot` hold at least `need` cells (its sequence's length after the next pass),
        growing by a block or a quarter, never past `limit` (its reservation) unless `need`
        is more."""
        start, cells = self._ranges.get(slot, (0, 0))
        if slot in self._ranges and need <= cells:
            return
        want = min(self._round(max(need, cells + cells // 4)), max(limit, need))
        others = self._others(slot)
        if slot in self._ranges:
            after = min((s for s, _ in others if s > start), default=None)
            if start + want <= (self.size if after is None else after):
                self._ranges[slot] = (start, want)  # the cells after it are free
                return
            if after is None and start + want <= self.max_tokens:  # the topmost: grow the pool
                self._grow(start + want)
                self._ranges[slot] = (start, want)
                return
        target = self._gap(want, slot)
        top = max((s + c for s, c in others), default=0)
        if target is None and top + want <= self.max_tokens:
            self._grow(top + want)
            target = top
        if target is None:
            saved = self._pool[:, :, :, start : start + cells].clone() if cells else None
            self._ranges.pop(slot, None)
            top = self._compact()
            if top + want > self.size:
                self._grow(top + want)  # past max_tokens only if admission let it (never)
            if saved is not None:
                self._pool[:, :, :, top : top + cells].copy_(saved)
            self._ranges[slot] = (top, want)
            return
        if slot in self._ranges:
            self._move(start, target, cells)
        self._ranges[slot] = (target, want)

    def _grow(self, size: int) -> None:
        if size > self.size:
            bigger = max(size, min(self.max_tokens, self.size + self.size // 2))
            self._resize(self._round(bigger))
            self.resizes += 1

    def _compact(self) -> int:
        """Move every range down, in order, leaving no gaps; the first free cell."""
        at = 0
        for slot, (start, cells) in sorted(self._ranges.items(), key=lambda item: item[1]):
            self._move(start, at, cells)
            self._ranges[slot] = (at, cells)
            at += cells
        self.compactions += 1
        return at

    def free(self, slot: int) -> None:
        """`slot`'s sequence ended: its cells are free; the pool shrinks when its upper half
        is, and is released when nothing runs."""
        if self._ranges.pop(slot, None) is None:
            return
        top = max((s + c for s, c in self._ranges.values()), default=0)
        if top == 0:
            self._resize(0)
        elif top <= self.size // 2:
            self._resize(self._round(top + top // 4))
        else:
            return
        self.resizes += 1

    # ---- a forward pass ------------------------------------------------------------------------

    def bind(
        self, offsets: list[int], positions: torch.Tensor, kv_len: int, whole: bool = False
    ) -> None:
        """The first cell of each row's sequence (batch order, from `offset`), the positions
        of its new tokens (`[batch, q]`) and how many cells of each row the attention reads.
        `whole`: hand the attention the layer's whole pool (a view, never a gather); it cuts
        each row's cells itself (attention.py)."""
        first = torch.tensor(offsets, dtype=torch.long)[:, None]
        self._write = self._cells(first + positions)
        self._kv_len = kv_len
        self._read = None
        self._gather = None
        if not whole:
            cells = first + torch.arange(kv_len)[None, :]
            self._gather = cells.clamp_(max=max(self.size - 1, 0))  # beyond: masked anyway
        self._whole = whole

    def bind_packed(self, cells: torch.Tensor, read: torch.Tensor, whole: bool = False) -> None:
        """A pass of one row holding several sequences' tokens back to back (no padding): the
        cell (offset + position) of each new token (`[1, q]`), and the cells its keys are read
        from, each sequence's cells one after the other (`[kv]`); the caller's mask keeps
        every query inside its own sequence."""
        self._write = self._cells(cells)
        self._kv_len = int(read.numel())
        self._gather = None
        self._read = None if whole else read
        self._whole = whole

    def _cells(self, cells: torch.Tensor) -> torch.Tensor:
        """The flat cell of every new key, in `[batch, heads, q]` order (the order of the
        states the attention hands over): one index_copy_ per layer writes them all, where
        advanced-index assignment took ~10x longer (docs/llm.md)."""
        heads = torch.arange(self.kv_heads)[None, :, None] * self.size
        return (heads + cells[:, None, :]).reshape(-1)

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        layer_idx: int,
        *args: Any,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        flat = (-1, self.head_dim)
        keys.view(flat).index_copy_(0, self._write, key_states.reshape(flat).to(keys.dtype))
        values.view(flat).index_copy_(0, self._write, value_states.reshape(flat).to(values.dtype))
        if self._whole:  # the whole pool, as stored: the attention cuts and widens each row
            return keys, values
        dtype = key_states.dtype
        if self._read is not None:  # [heads, kv, dim] -> [1, heads, kv, dim]
            return keys[0][:, self._read][None].to(dtype), values[0][:, self._read][None].to(dtype)
        assert self._gather is not None
        # [heads, batch, kv_len, dim] -> [batch, heads, kv_len, dim]
        read_keys = keys[0][:, self._gather].transpose(0, 1)
        return read_keys.to(dtype), values[0][:, self._gather].transpose(0, 1).to(dtype)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._kv_len

    def get_mask_sizes(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
        return self._kv_len, 0

    @property
    def is_compileable(self) -> bool:
        return False

    def __len__(self) -> int:
        return self.num_layers


def attention_mask(positions: torch.Tensor, kv_len: int, dtype: torch.dtype) -> torch.Tensor:
    """`[batch, 1, q, kv_len]`: 0 where a key position is at or before the query's, else the
    dtype's minimum (what transformers' own masks use)."""
    keys = torch.arange(kv_len)
    visible = keys[None, None, :] <= positions[:, :, None]
    mask = torch.zeros(visible.shape, dtype=dtype)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[:, None]


def packed_mask(
    query_seq: torch.Tensor,
    query_pos: torch.Tensor,
    key_seq: torch.Tensor,
    key_pos: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    """`[1, 1, q, kv]` for a packed pass: a query sees the keys of its own sequence at or
    before its position."""
    visible = (query_seq[:, None] == key_seq[None, :]) & (key_pos[None, :] <= query_pos[:, None])
    mask = torch.zeros(visible.shape, dtype=dtype)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[None, None]
