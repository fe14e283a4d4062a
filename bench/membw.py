"""This machine's memory read bandwidth, as a decode step sees it: one pass summing a buffer far
larger than the last-level cache (a weight read once per token never stays in cache), several
passes at several sizes (a read-reduction loop, torch's `sum` on as many threads as the engine
runs). The figure is the fastest pass's: what the memory can give when the machine lets it (on
a shared machine the median mostly measures the neighbours); the medians are kept beside it.

    python bench/membw.py [--threads 0] [--sizes-mib 0 (4x, 8x and 16x the LLC)]

Imported by bench/llm_token_cost.py for its weight-bandwidth limit."""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch


def llc_bytes() -> int:
    """The largest cache's size in bytes (sysfs), 32 MiB when unreadable."""
    best = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        best = max(best, int(text.rstrip("KMG")) * scale)
    return best or 32 << 20


@dataclass
class Bandwidth:
    llc_bytes: int
    threads: int
    median_bytes_per_s: dict[str, float]  # "<MiB> MiB" -> the median pass's bytes/s
    best_bytes_per_s: dict[str, float]  # "<MiB> MiB" -> the fastest pass's
    bytes_per_s: float  # the fastest pass of all
    # Bytes per second of the process's CPU time (all threads): on a machine shared with
    # others, what a core reads while it runs, however long it waits for a turn.
    bytes_per_cpu_s: float


def read_bandwidth(sizes: list[int] | None = None, passes: int = 15) -> Bandwidth:
    """Bytes per second of a read-reduction over buffers of `sizes` bytes (default 4x, 8x and
    16x the LLC)."""
    llc = llc_bytes()
    sizes = sizes or [4 * llc, 8 * llc, 16 * llc]
    medians: dict[str, float] = {}
    cpu_times: list[tuple[int, float]] = []
    best: dict[str, float] = {}
    for size in sizes:
        buffer = torch.ones(size // 4, dtype=torch.float32)  # touched: every page is resident
        buffer.sum()
        times = []
        for _ in range(passes):
            started, cpu = time.perf_counter(), time.process_time()
            buffer.sum()
            times.append(time.perf_counter() - started)
            cpu_times.append((size, time.process_time() - cpu))
        medians[f"{size >> 20} MiB"] = size / statistics.median(times)
        best[f"{size >> 20} MiB"] = size / min(times)
        del buffer
    per_cpu = max(size / max(cpu, 1e-6) for size, cpu in cpu_times)
    return Bandwidth(llc, torch.get_num_threads(), medians, best, max(best.values()), per_cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: its default)")
    parser.add_argument("--sizes-mib", default="", help="comma-separated (default: from the LLC)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = [int(s) << 20 for s in args.sizes_mib.split(",") if s] or None
    got = read_bandwidth(sizes)
    for size, rate in got.best_bytes_per_s.items():
        median = got.median_bytes_per_s[size]
        print(f"{size:>10s}  fastest {rate / 1e9:.1f} GB/s, median {median / 1e9:.1f} GB/s")
    print(f"read bandwidth {got.bytes_per_s / 1e9:.1f} GB/s ({got.threads} threads)")
    print(f"per CPU-second {got.bytes_per_cpu_s / 1e9:.1f} GB")


if __name__ == "__main__":
    main()
