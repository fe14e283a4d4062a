"""What a grown ring costs a 4 MiB tensor against the old fixed 8 MiB ring (issue 41).

Two rings in /dev/shm, in one process: `fixed`, the 8 MiB ring every stub had before issue 41,
and `grown`, a 512 KiB ring (the default now) with 1 MiB growth steps, grown to 4.5 MiB by the
first message. Each round trip is one message's way through a ring as the Python backend makes
it: pack a 4 MiB FP32 tensor (oceanus.ipc.tensors.pack), open its block, copy it out, release
it. The two alternate, `--number` round trips each per repeat; the best repeat of each is
printed (this measures code and memory, not the machine's noise).

    python bench/investigations/ring_growth.py [--number 50] [--repeat 15]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from oceanus.ipc import rings, tensors


def ring(folder: str, name: str, capacity: int, growth: int) -> tuple[Any, Any]:
    path = f"{folder}/{name}"
    rings.create_ring_file(path, capacity)
    writer = rings.RingWriter(path, capacity, f"{folder}/{name}-spill-", growth)
    reader = rings.RingReader(path, capacity)
    os.unlink(path)
    return writer, reader


def round_trips(writer: Any, reader: Any, data: np.ndarray, number: int) -> float:
    """Seconds per round trip."""
    started = time.perf_counter()
    for _ in range(number):
        loc, descs = tensors.pack(writer, [[("x", "FP32", data)]])
        assert loc is not None and loc[0] in ("r", "g"), loc
        block, token = reader.open(loc)
        out = tensors.unpack(block, descs[0], copy=True)[0][2]
        reader.release(token)
    assert out[-1] == data[-1]
    return (time.perf_counter() - started) / number


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    data = np.arange(1 << 20, dtype=np.float32)  # 4 MiB
    with tempfile.TemporaryDirectory(dir=rings.shm_dir(), prefix="oceanus-ring-growth-") as tmp:
        pairs = {
            "fixed 8 MiB": ring(tmp, "fixed", 8 << 20, 0),
            "grown from 512 KiB": ring(tmp, "grown", 512 << 10, 1 << 20),
        }
        best = {name: float("inf") for name in pairs}
        for _ in range(args.repeat):
            for name, (writer, reader) in pairs.items():
                best[name] = min(best[name], round_trips(writer, reader, data, args.number))
        grown_writer = pairs["grown from 512 KiB"][0]
        for writer, reader in pairs.values():
            writer.close()
            reader.close()
    print(f"grown ring's capacity: {grown_writer.capacity >> 10} KiB")
    for name, seconds in best.items():
        print(f"{name:20s} {seconds * 1e6:8.0f} µs per 4 MiB round trip (best of {args.repeat})")
    ratio = best["fixed 8 MiB"] / best["grown from 512 KiB"]
    print(f"grown / fixed throughput: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
