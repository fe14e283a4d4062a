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
upper half is free and is released when no sequence runs (and, with prefix caching, nothing is
cached). So a loaded model holds no KV cells, and a short chat holds what it wrote, not
`max_model_len`.

Before a forward pass the engine `reserve`s each sequence's cells and `bind`s the cells the new
tokens take. In a `whole` pass (attention.py's per-sequence attention) `update` returns the
layer's whole pool as it is stored, and the attention cuts each sequence's cells by its offset
and length (and widens them to the model's dtype when `kv_cache_dtype` differs); otherwise it
gathers `[batch, kv_heads, kv_len, head_dim]` for transformers' attention under the engine's
mask, cells beyond a sequence's length being masked.

The cache may hold another dtype than the model computes in (model.json's `kv_cache_dtype`):
new keys are rounded to it as they are written.

Prefix caching (vLLM's automatic prefix caching, `enable_prefix_caching`): when a sequence ends,
its range is not freed but kept, cut to its full blocks, as a cached entry: a range of the same
pool under a negative key, so that gaps, growth and compaction treat it as any range. Each full
block is hashed by its tokens and the hash of the block before it (a chained hash, so a block's
hash names everything before it too). A new sequence whose prompt starts with cached blocks
`take`s them: its range is reserved and the matching cells are copied into it (one copy of the
prefix's KV, far cheaper than computing it; the sequence's range stays contiguous, so decode
reads it as before). Cached entries hold no reservation: when a range needs room that the pool
within the budget cannot give, entries are evicted least recently used first (a whole entry at
a time) until the live ranges plus the rest fit, so admission (which counts live reservations
only) never waits for the cache."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache


@dataclass
class _Entry:
    """A finished sequence's full blocks, kept for later prompts that start with them."""

    tokens: list[int]  # the cached tokens (whole blocks), to check a hash's match
    hashes: list[int]  # each block's chained hash
    used: int  # the LRU clock when it was last kept or taken from
    salt: int = 0  # the LoRA adapter id whose KV this is (0: the base model's)


def block_hashes(tokens: list[int], block: int, salt: int = 0) -> list[int]:
    """Each full block's hash, chained: a block's hash covers every token before it, and
    `salt` (a LoRA adapter's id: an adapter's KV differs from the base model's)."""
    hashes: list[int] = []
    parent = hash(("lora", salt)) if salt else 0
    for end in range(block, len(tokens) + 1, block):
        parent = hash((parent, tuple(tokens[end - block : end])))
        hashes.append(parent)
    return hashes


class SlotCache(Cache):
    def __init__(
        self,
        layers: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        max_tokens: int,
        block: int = 16,
        prefix_caching: bool = False,
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
        # Prefix caching: entries under negative keys of `_ranges`, a block hash's entry and
        # block index, the LRU clock, and an entry being copied from (not to be evicted).
        self.prefix_caching = prefix_caching
        self._entries: dict[int, _Entry] = {}
        self._hashes: dict[int, tuple[int, int]] = {}
        self._clock = 0
        self._next_entry = -1
        self._pinned: int | None = None
        self.evictions = 0
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
        """Cells held by running sequences (cached entries not counted)."""
        return sum(cells for slot, (_, cells) in self._ranges.items() if slot >= 0)

    @property
    def cached_tokens(self) -> int:
        return sum(len(entry.tokens) for entry in self._entries.values())

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
        target = self._place(want, slot)
        if target is None and self._entries:
            # No room within the budget: evict cached entries, least recently used first,
            # until the live ranges, the other entries and this one fit (what any place needs),
            # then look again; compaction (below) makes the room if no gap opened.
            held = sum(c for s, (_, c) in self._ranges.items() if s != slot)
            for key in self._evictable():
                if held + want <= self.max_tokens:
                    break
                held -= self._ranges[key][1]
                self._evict(key)
            target = self._place(want, slot)
        start, cells = self._ranges.get(slot, (0, 0))
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

    def _place(self, want: int, slot: int) -> int | None:
        """A free run of `want` cells for `slot`: a gap, else above the others by growing the
        pool within the budget; None if neither."""
        target = self._gap(want, slot)
        top = max((s + c for s, c in self._others(slot)), default=0)
        if target is None and top + want <= self.max_tokens:
            self._grow(top + want)
            target = top
        return target

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
        is, and is released when nothing runs and nothing is cached."""
        if self._ranges.pop(slot, None) is None:
            return
        self._shrink()

    def _shrink(self) -> None:
        top = max((s + c for s, c in self._ranges.values()), default=0)
        if top == 0:
            self._resize(0)
        elif top <= self.size // 2:
            self._resize(self._round(top + top // 4))
        else:
            return
        self.resizes += 1

    # ---- prefix caching ------------------------------------------------------------------------

    def keep(self, slot: int, tokens: list[int], salt: int = 0) -> None:
        """`slot`'s sequence ended having written the KV of `tokens`: keep its full blocks as a
        cached entry (unless prefix caching is off, nothing is whole, or every block is cached
        already), else free its cells."""
        whole = len(tokens) // self.block * self.block
        if not self.prefix_caching or slot not in self._ranges or whole == 0:
            self.free(slot)
            return
        tokens = tokens[:whole]
        self._clock += 1
        found, cached = self.lookup(tokens, salt)
        if cached == whole:  # nothing new: the entry that has it is used again
            self._entries[found].used = self._clock
            self.free(slot)
            return
        start, _ = self._ranges.pop(slot)
        key = self._next_entry
        self._next_entry -= 1
        hashes = block_hashes(tokens, self.block, salt)
        self._ranges[key] = (start, whole)
        self._entries[key] = _Entry(tokens, hashes, self._clock, salt)
        for index, block_hash in enumerate(hashes):
            self._hashes[block_hash] = (key, index)
        self._shrink()

    def lookup(self, tokens: list[int], salt: int = 0) -> tuple[int, int]:
        """The entry holding the longest run of `tokens`' leading full blocks and how many
        tokens that is (0: none), among the entries of the same `salt` (LoRA adapter). The
        tokens are compared, so a hash collision is no hit."""
        found, cached = 0, 0
        for index, block_hash in enumerate(block_hashes(tokens, self.block, salt)):
            hit = self._hashes.get(block_hash)
            if hit is None or hit[1] != index:
                break
            end = (index + 1) * self.block
            entry = self._entries[hit[0]]
            if entry.salt != salt or entry.tokens[:end] != tokens[:end]:
                break
            found, cached = hit[0], end
        return found, cached

    def take(self, slot: int, entry: int, cells: int, limit: int) -> None:
        """Start `slot`'s range with the first `cells` cells of cached `entry` (a copy)."""
        held = sum(c for _, c in self._ranges.values())
        if held + self._round(cells) <= self.max_tokens:  # room without evicting `entry`
            self._pinned = entry
            try:
                self.reserve(slot, cells, limit)
            finally:
                self._pinned = None
            source = self._ranges[entry][0]
            target = self._ranges[slot][0]
            pool = self._pool
            pool[:, :, :, target : target + cells].copy_(pool[:, :, :, source : source + cells])
        else:  # the budget is tight: hold the cells aside, as `entry` may have to go
            source = self._ranges[entry][0]
            saved = self._pool[:, :, :, source : source + cells].clone()
            self.reserve(slot, cells, limit)
            target = self._ranges[slot][0]
            self._pool[:, :, :, target : target + cells].copy_(saved)
            if entry not in self._entries:
                return
        self._clock += 1
        self._entries[entry].used = self._clock

    def _evictable(self) -> list[int]:
        """Cached entries that may be evicted, least recently used first."""
        keys = [key for key in self._entries if key != self._pinned]
        return sorted(keys, key=lambda key: self._entries[key].used)

    def _evict(self, key: int) -> None:
        entry = self._entries.pop(key)
        self._ranges.pop(key)
        for block_hash in entry.hashes:
            if self._hashes.get(block_hash, (None,))[0] == key:
                del self._hashes[block_hash]
        self.evictions += 1

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
