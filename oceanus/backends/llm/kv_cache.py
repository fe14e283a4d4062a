"""A KV cache of fixed slots that transformers' attention layers write into, one row per
sequence, so that sequences of different lengths decode in one batched forward pass.

Each running sequence owns a slot (a row of `[slots, kv_heads, capacity, head_dim]` per layer).
Before a forward pass the engine `bind`s the slots and the positions the new tokens take; the
model's attention calls `update`, which writes the new keys and values at those positions and
returns the bound rows up to the longest length. The engine passes a 4D mask that lets each
query see only its own sequence's earlier positions, so the stale or padded cells beyond a
sequence's length are never read. Memory is allocated with zeros, which the OS maps lazily:
only the cells sequences reach are ever touched.

The cache may hold another dtype than the model computes in (model.json's `kv_cache_dtype`):
new keys are rounded to it as they are written, and what `update` returns is widened back to
the states' dtype, except in a `whole` pass, where the attention (attention.py) widens each
sequence's own cells as it reads them, never every slot."""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache


class SlotCache(Cache):
    def __init__(
        self,
        layers: int,
        slots: int,
        kv_heads: int,
        capacity: int,
        head_dim: int,
        dtype: torch.dtype,
    ) -> None:
        super().__init__(layers=[])
        shape = (slots, kv_heads, capacity, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype) for _ in range(layers)]
        self.capacity = capacity
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        # Where the next pass's keys go in a layer's flat `[slots * heads * capacity, dim]` view.
        self._write = torch.zeros(0, dtype=torch.long)
        self._rows = torch.zeros(0, dtype=torch.long)
        self._positions = torch.zeros(0, 0, dtype=torch.long)
        self._kv_len = 0
        self._contiguous: tuple[int, int] | None = None
        self._whole = False
        # A packed pass (bind_packed): the cells each of its keys comes from, `[kv]` each.
        self._read: tuple[torch.Tensor, torch.Tensor] | None = None

    def bind(
        self, rows: list[int], positions: torch.Tensor, kv_len: int, whole: bool = False
    ) -> None:
        """The slots of the next forward pass (batch order), the positions of its new tokens
        (`[batch, q]`) and how many cells of each row the attention reads. `whole`: hand the
        attention every slot (a view, never a gather); its caller picks each row's slot
        itself (attention.py's row-by-row decode)."""
        self._rows = torch.tensor(rows, dtype=torch.long)[:, None]
        self._positions = positions
        self._write = self._cells(self._rows, positions)
        self._kv_len = kv_len
        self._read = None
        # Consecutive slots read as a view, without a gather.
        first = rows[0]
        self._contiguous = (
            (first, first + len(rows)) if rows == list(range(first, first + len(rows))) else None
        )
        if whole:
            self._contiguous = (0, len(self.keys[0]))
        self._whole = whole

    def bind_packed(
        self,
        slots: torch.Tensor,
        positions: torch.Tensor,
        read_slots: torch.Tensor,
        read_positions: torch.Tensor,
        whole: bool = False,
    ) -> None:
        """A pass of one row holding several sequences' tokens back to back (no padding): the
        slot and position of each new token (`[1, q]`), and the cells its keys are read from,
        each sequence's cells one after the other (`[kv]`); the caller's mask keeps every
        query inside its own sequence."""
        self._rows = slots
        self._positions = positions
        self._write = self._cells(slots, positions)
        self._kv_len = int(read_slots.numel())
        self._contiguous = None
        self._read = (read_slots, read_positions)
        if whole:  # the attention reads each sequence's cells from the slots itself
            self._contiguous, self._read = (0, len(self.keys[0])), None
        self._whole = whole

    def _cells(self, slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The flat cell of every new key, in `[batch, heads, q]` order (the order of the
        states the attention hands over): one index_copy_ per layer writes them all, where
        advanced-index assignment took ~10x longer (docs/llm.md)."""
        heads = torch.arange(self.kv_heads)[None, :, None]
        rows = slots.expand(positions.shape)[:, None, :]
        return ((rows * self.kv_heads + heads) * self.capacity + positions[:, None, :]).reshape(-1)

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
        if self._whole:  # every slot, as stored: the attention cuts and widens each row
            start, end = self._contiguous or (0, len(keys))
            return keys[start:end, :, : self._kv_len], values[start:end, :, : self._kv_len]
        read_keys, read_values = self._cells_read(keys, values)
        dtype = key_states.dtype
        return read_keys.to(dtype), read_values.to(dtype)  # no copy when the dtypes match

    def _cells_read(
        self, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self._read is not None:
            slots, cells = self._read
            # [kv, heads, dim] -> [1, heads, kv, dim]
            return (
                keys[slots, :, cells].permute(1, 0, 2)[None],
                values[slots, :, cells].permute(1, 0, 2)[None],
            )
        if self._contiguous is not None:
            start, end = self._contiguous
            return keys[start:end, :, : self._kv_len], values[start:end, :, : self._kv_len]
        # Cut to the cells read before gathering the rows: the copy is then `kv_len` cells per
        # row, not the slot's whole capacity (max_model_len + a prefill chunk).
        rows = self._rows[:, 0]
        return (
            keys[:, :, : self._kv_len].index_select(0, rows),
            values[:, :, : self._kv_len].index_select(0, rows),
        )

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._kv_len

    def get_mask_sizes(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
        return self._kv_len, 0

    @property
    def is_compileable(self) -> bool:
        return False

    def __len__(self) -> int:
        return len(self.keys)


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
