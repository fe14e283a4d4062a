"""Decode attention alone, on the 100m model's shapes (12 layers, 12 query heads over 4 KV heads
of 64): the engine's row-by-row SDPA (attention.py) against one call per length bucket over the
bucket's rows gathered and padded to its longest, masked (SDPA, or matmul-softmax-matmul).

    python bench/investigations/llm_attention.py [--batch 32] [--context 32,512] [--reps 20]
        [--threads N]

Prints the median ms of one decode pass's attention (12 layers, each its own cache tensors) per
variant, alternated, whether each equals the row path bitwise, the per-call floor (every row one
cell long) and the machine's read bandwidth (a sum over 256 MB) beside what the row path reads.
Writes bench/results/llm-attention.json."""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from oceanus.backends.llm.attention import slot_attention

LAYERS, HEADS, KV_HEADS, DIM, CAPACITY = 12, 12, 4, 64, 776
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, list[int], list[int]], torch.Tensor]


def rows(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: list[int], lens: list[int]
) -> torch.Tensor:
    """The engine's path: `q` `[batch, heads, 1, dim]`, `k`/`v` every slot, as views of the
    cache's pool (kv_cache.py: heads first, each slot's cells a contiguous range)."""
    pool_k = k.transpose(0, 1).reshape(1, KV_HEADS, -1, DIM)  # a view: no copy
    pool_v = v.transpose(0, 1).reshape(1, KV_HEADS, -1, DIM)
    offsets = [slot * CAPACITY for slot in slots]
    return slot_attention(
        torch.nn.Module(), q, pool_k, pool_v, None, slot_lengths=lens, slot_offsets=offsets
    )[0]


def bucketed(buckets: int, matmul: bool) -> Attend:
    def attend(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: list[int], lens: list[int]
    ) -> torch.Tensor:
        batch = q.shape[0]
        grouped = q.reshape(batch, KV_HEADS, HEADS // KV_HEADS, DIM)
        out = torch.empty_like(grouped)
        order = sorted(range(batch), key=lambda row: lens[row])
        size = -(-batch // buckets)
        for first in range(0, batch, size):
            picked = order[first : first + size]
            longest = max(lens[row] for row in picked)
            which = torch.tensor(picked)
            cells = torch.tensor([slots[row] for row in picked])
            # The gather copies the bucket's cells: the price of one call over rows in any slot.
            keys, values = k[:, :, :longest][cells], v[:, :, :longest][cells]
            lengths = torch.tensor([lens[row] for row in picked])
            seen = (torch.arange(longest)[None, :] < lengths[:, None])[:, None, None, :]
            if matmul:
                scores = torch.matmul(grouped[which], keys.transpose(-1, -2)) * DIM**-0.5
                scores.masked_fill_(~seen, float("-inf"))
                out[which] = torch.matmul(torch.softmax(scores, -1), values)
            else:
                out[which] = torch.nn.functional.scaled_dot_product_attention(
                    grouped[which], keys, values, attn_mask=seen
                )
        return out.reshape(batch, 1, HEADS, DIM)

    return attend


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", default="32,512", help="min,max cells each row reads")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: its default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rng = random.Random(0)
    low, high = (int(x) for x in args.context.split(","))
    lens = [rng.randint(low, high) for _ in range(args.batch)]
    slots = list(range(args.batch))
    rng.shuffle(slots)  # the engine's running rows sit in any slots
    # The pool's layout (heads first), seen as `[slots, heads, capacity, dim]` without a copy.
    shape = (KV_HEADS, args.batch, CAPACITY, DIM)
    layers = [
        (torch.randn(shape).transpose(0, 1), torch.randn(shape).transpose(0, 1))
        for _ in range(LAYERS)
    ]
    query = torch.randn(args.batch, HEADS, 1, DIM)
    variants: dict[str, tuple[Attend, list[int]]] = {"rows (engine)": (rows, lens)}
    for buckets in (1, 2, 4, 8):
        variants[f"{buckets} bucket(s), SDPA masked"] = (bucketed(buckets, False), lens)
        variants[f"{buckets} bucket(s), matmul masked"] = (bucketed(buckets, True), lens)
    variants["rows, 1 cell each (per-call floor)"] = (rows, [1] * args.batch)
    reference = rows(query, *layers[0], slots, lens)
    exact = {
        name: torch.equal(attend(query, *layers[0], slots, lens), reference)
        for name, (attend, _) in variants.items()
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    with torch.inference_mode():
        for _ in range(args.reps):
            for name, (attend, lengths) in variants.items():
                began = time.perf_counter()
                for key, value in layers:
                    attend(query, key, value, slots, lengths)
                times[name].append(time.perf_counter() - began)
    big = torch.randn(64 * 1024 * 1024)
    sums = []
    for _ in range(10):
        began = time.perf_counter()
        big.sum()
        sums.append(time.perf_counter() - began)
    read_gbs = big.numel() * 4 / statistics.median(sums) / 1e9
    row_bytes = sum(lens) * KV_HEADS * DIM * 4 * 2 * LAYERS
    row_gbs = row_bytes / statistics.median(times["rows (engine)"]) / 1e9
    report: dict[str, object] = {
        "batch": args.batch,
        "context": args.context,
        "threads": torch.get_num_threads(),
        "read_GBps": read_gbs,
        "rows_GBps": row_gbs,
    }
    for name in variants:
        median_ms = statistics.median(times[name]) * 1000
        print(
            f"{name}: {median_ms:.2f} ms per decode pass ({LAYERS} layers), min "
            f"{min(times[name]) * 1000:.2f}; bitwise equal to rows: {exact[name]}"
        )
        report[name] = {"ms_median": median_ms, "bitwise_equal": exact[name]}
    print(
        f"threads {torch.get_num_threads()}: memory read {read_gbs:.1f} GB/s (sum of 256 MB); "
        f"the row path reads {row_bytes / 1e6:.0f} MB of cache at {row_gbs:.1f} GB/s"
    )
    out = Path(__file__).resolve().parent.parent / "results" / "llm-attention.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
