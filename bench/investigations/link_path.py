"""The core's end of the frontend worker link, in process (issue 27): what the core process does
per request a worker sends, without the socket's system calls.

A real ServerCore serving the example `simple`, its real CoreLink and AioChannel (the asyncio
face of oceanus/ipc), fed the frames a worker writes (`batch` framed `Infer` messages per read,
as the core reads them under load) straight into `data_received`; one loop turn later the
channel's flush hands the answers to a transport that only counts bytes. So the figure is the
core's Python per request over the link: unframe, decode, validate, queue, execute (ONNX Runtime,
in place), complete, encode, frame; the write itself and the wake-up are
bench/investigations/link_cost.py's.

With `--trees A,B` each round runs this script once per tree (PYTHONPATH=<tree>), alternating,
so the machine's noise hits both alike; medians and the ratio B/A are printed.

    python bench/investigations/link_path.py [--requests 20000] [--batch 8] [--rounds 5]
        [--trees ../main,.]
                              [--busy-neighbour]

`--busy-neighbour` keeps another CPU busy meanwhile: on the 2-vCPU VMs this alone makes the
same Python cost about 1.4x the CPU time (docs/architecture.md, "The core's budget").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent.parent  # bench/


class _CountingTransport:
    """Where the channel's flush writes: counts the frames (the write is link_cost.py's)."""

    def __init__(self) -> None:
        self.frames = 0

    def write(self, data: bytes) -> None:
        offset = 0
        while offset < len(data):
            offset += 4 + int.from_bytes(data[offset : offset + 4], "little")
            self.frames += 1

    def close(self) -> None:
        pass


async def _measure(requests: int, batch: int) -> dict[str, float]:
    import numpy as np

    from oceanus.backends import builtin
    from oceanus.core.server import CoreOptions, ServerCore
    from oceanus.core.types import InferRequest, Tensor
    from oceanus.examples import example_repository
    from oceanus.frontends.workers import messages as m
    from oceanus.frontends.workers.core_link import CoreLink
    from oceanus.ipc.aio import AioChannel
    from oceanus.ipc.channel import frame

    repository = example_repository(["simple"])
    core = ServerCore(
        CoreOptions([repository], backends=builtin.registry(entry_points=False), load_threads=2)
    )
    await core.start()
    data = np.arange(16, dtype=np.int32).reshape(1, 16)
    request = InferRequest(
        "simple", inputs=[Tensor(n, "INT32", (1, 16), data) for n in ("INPUT0", "INPUT1")]
    )
    fields, block = m.place_request(m.encode_request(request), None)
    # As a worker validated it against its mirror (frontends/workers/mirror.py), where the tree
    # has one: the version's serial; a tree without sends what it always did.
    serial = getattr(core.resolve("simple"), "serial", None)
    extra = () if serial is None else (serial,)
    chunk = b"".join(
        frame(m.Infer(i, "HTTP end point", fields, block, *extra)) for i in range(batch)
    )
    link = CoreLink(core, None, {})  # type: ignore[arg-type]  # forwarded calls: none here
    channel = AioChannel(m.KINDS, link.receive, lambda: None)
    transport = _CountingTransport()
    channel.connection_made(transport)  # type: ignore[arg-type]
    link.channel = channel

    async def run(count: int) -> None:
        for _ in range(count // batch):
            expected = transport.frames + batch
            channel.data_received(chunk)
            while transport.frames < expected:  # requests past the first execute a turn later
                await asyncio.sleep(0)

    try:
        await run(2000)  # warm-up: the instance moves onto the loop
        started, cpu = time.perf_counter(), time.process_time()
        await run(requests)
        done = requests // batch * batch
        wall_us = (time.perf_counter() - started) / done * 1e6
        cpu_us = (time.process_time() - cpu) / done * 1e6
    finally:
        await core.shutdown()
    return {"us": wall_us, "cpu_us": cpu_us}


def _child(requests: int, batch: int) -> None:
    try:
        import uvloop

        result = uvloop.run(_measure(requests, batch))
    except ImportError:
        result = asyncio.run(_measure(requests, batch))
    print(json.dumps(result))


def _run_tree(tree: Path, requests: int, batch: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    argv = [sys.executable, str(BENCH_DIR / "investigations" / "link_path.py"), "--child"]
    argv += ["--requests", str(requests), "--batch", str(batch)]
    output = subprocess.run(argv, env=env, check=True, capture_output=True, text=True).stdout
    result: dict[str, float] = json.loads(output.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=8, help="Infer messages per read")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--trees", default=".", help="comma-separated checkouts to compare")
    parser.add_argument(
        "--busy-neighbour",
        action="store_true",
        help="keep another CPU busy meanwhile (a Python busy loop), as the workers and the "
        "load generator do in the server: what that alone adds to the core's CPU time",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.requests, args.batch)
        return 0
    trees = [Path(tree).resolve() for tree in args.trees.split(",")]
    rows: dict[Path, list[dict[str, float]]] = {tree: [] for tree in trees}
    neighbour = None
    if args.busy_neighbour:
        neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        for round_index in range(args.rounds):
            for tree in trees:
                result = _run_tree(tree, args.requests, args.batch)
                rows[tree].append(result)
                print(f"round {round_index + 1} {tree.name}: {result}")
    finally:
        if neighbour is not None:
            neighbour.kill()
            neighbour.wait()
    medians: dict[str, dict[str, Any]] = {}
    for tree, results in rows.items():
        medians[str(tree)] = {
            key: statistics.median(r[key] for r in results) for key in ("us", "cpu_us")
        }
        print(
            f"{tree}: {medians[str(tree)]['us']:.2f} us/request, "
            f"{medians[str(tree)]['cpu_us']:.2f} CPU-us/request (medians of {args.rounds})"
        )
    if len(trees) > 1:
        first, last = medians[str(trees[0])], medians[str(trees[-1])]
        print(f"ratio {trees[-1].name}/{trees[0].name}: CPU {last['cpu_us'] / first['cpu_us']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
