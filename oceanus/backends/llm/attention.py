"""Decode attention that reads each sequence's own cells only.

A batched decode pass over padded rows would read every row up to the longest sequence's
length, and the mask would hide the rest: with prompts of 32-512 tokens, about half of what SDPA
reads (and masks) is another sequence's padding, and a decode step's attention is bound by
reading the cache. When the engine passes `slot_lengths` and `slot_offsets` (one int per row, a
decode pass), this runs SDPA row by row on views of each row's cells in the cache's pool
(kv_cache.py: a sequence's cells are contiguous) cut to its length, with no mask and no gather
(the cache hands over the layer's whole pool as a view). With `slot_chunks` (a packed prefill
pass) each sequence's chunk attends to its own cells the same way, under a causal mask shifted
by the chunk's start. Otherwise (generate, other
callers) it is transformers' own SDPA path unchanged. A KV cache kept in another dtype than
the model's (kv_cache_dtype) is widened here, one sequence's cells at a time."""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "oceanus_slots"


def slot_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    lengths: list[int] | None = kwargs.pop("slot_lengths", None)
    # Where each batch row's cells start in `key`/`value` (the cache's whole pool, as a view).
    offsets: list[int] | None = kwargs.pop("slot_offsets", None)
    chunks: list[tuple[int, int, int]] | None = kwargs.pop("slot_chunks", None)
    if chunks is not None:
        return _packed_prefill(query, key, value, chunks, scaling), None
    if lengths is None or offsets is None or query.shape[2] != 1:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    # One query token: its heads grouped per KV head ([kv_heads, group, dim]) attend to that
    # head's keys without repeating them (what transformers' pack_gqa does for a batch).
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, dim)
    attend = torch.nn.functional.scaled_dot_product_attention
    # A cache kept in another dtype (kv_cache_dtype) is widened row by row.
    widen = key.dtype != query.dtype
    # The per-row Python is a tenth of the attention's time (docs/llm.md): `narrow` views, no
    # slice tuples, no no-op `.to`, one `cat`.
    outs = []
    # 4-D slices: SDPA's CPU flash kernel takes only 4-D inputs (3-D falls back to its math).
    for q, offset, length in zip(grouped.split(1), offsets, lengths, strict=True):
        k, v = key.narrow(2, offset, length), value.narrow(2, offset, length)
        if widen:
            k, v = k.to(query.dtype), v.to(query.dtype)
        outs.append(attend(q, k, v, scale=scaling))
    out = torch.cat(outs)
    # [batch, kv_heads, group, dim] -> [batch, 1, heads, dim], the layout the layer expects.
    return out.reshape(batch, 1, heads, dim), None


def _packed_prefill(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    chunks: list[tuple[int, int, int]],
    scaling: float | None,
) -> torch.Tensor:
    """A packed prefill pass (`query` `[1, heads, q, dim]`, the sequences' chunks back to
    back; `chunks`: each one's first cell in the pool, its start position and its length),
    each chunk against its own cells `[0, start + n)` with a causal mask shifted
    by `start`: no gather of the keys, no repeat of the KV heads, no dense block mask."""
    _, heads, total, dim = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads
    out = torch.empty(1, total, heads, dim, dtype=query.dtype)
    attend = torch.nn.functional.scaled_dot_product_attention
    offset = 0
    for first, start, n in chunks:
        end = start + n
        # The group's query heads of one KV head as one longer query: [1, kv_heads, group*n, dim]
        q = query[:, :, offset : offset + n].reshape(1, kv_heads, group * n, dim)
        visible = torch.arange(end)[None, :] <= torch.arange(start, end)[:, None]
        mask = visible.repeat(group, 1)
        k = key.narrow(2, first, end).to(query.dtype)
        v = value.narrow(2, first, end).to(query.dtype)
        got = attend(q, k, v, attn_mask=mask, scale=scaling)
        # [1, kv_heads, group*n, dim] -> [1, n, heads, dim]
        out[:, offset : offset + n] = got.reshape(1, heads, n, dim).transpose(1, 2)
        offset += n
    return out


def register() -> str:
    """Make `NAME` an attention implementation transformers' models accept; returns it."""
    AttentionInterface.register(NAME, slot_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME
