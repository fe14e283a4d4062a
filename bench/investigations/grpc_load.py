"""A small gRPC load generator: N concurrent tritonclient.grpc.aio tasks calling ModelInfer.

    python bench/investigations/grpc_load.py --url 127.0.0.1:8001 --model simple
        --concurrency 16 --seconds 10

Prints inferences per second and latency percentiles. `--stream` sends over one ModelStreamInfer
stream per task instead of unary calls. The default inputs fit Triton's `simple` model (two INT32
[1,16] tensors); `--model identity_fp32 --shape 1,16` drives a one-input identity model.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncIterator

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient


def _inputs(model: str, shape: list[int]) -> list[grpcclient.InferInput]:
    dtype: type[np.generic]
    if model.startswith("simple"):
        names, datatype, dtype = ["INPUT0", "INPUT1"], "INT32", np.int32
    else:
        names, datatype, dtype = ["INPUT0"], "FP32", np.float32
    inputs = []
    for name in names:
        tensor = grpcclient.InferInput(name, shape, datatype)
        tensor.set_data_from_numpy(np.ones(shape, dtype=dtype))
        inputs.append(tensor)
    return inputs


async def _unary_worker(
    client: aioclient.InferenceServerClient,
    model: str,
    inputs: list[grpcclient.InferInput],
    stop_at: float,
    latencies: list[float],
) -> None:
    while True:
        start = time.perf_counter()
        if start >= stop_at:
            return
        await client.infer(model, inputs)
        latencies.append(time.perf_counter() - start)


async def _stream_worker(
    client: aioclient.InferenceServerClient,
    model: str,
    inputs: list[grpcclient.InferInput],
    stop_at: float,
    latencies: list[float],
) -> None:
    queue: asyncio.Queue[dict[str, object] | None] = asyncio.Queue()

    async def requests() -> AsyncIterator[dict[str, object]]:
        while True:
            item = await queue.get()
            if item is None:
                return
            yield item

    responses = client.stream_infer(requests())
    while True:
        start = time.perf_counter()
        if start >= stop_at:
            queue.put_nowait(None)
            break
        queue.put_nowait({"model_name": model, "inputs": inputs})
        _result, error = await responses.__anext__()
        if error is not None:
            raise error
        latencies.append(time.perf_counter() - start)
    async for _ in responses:
        pass


async def run(args: argparse.Namespace) -> None:
    shape = [int(d) for d in args.shape.split(",")]
    inputs = _inputs(args.model, shape)
    client = aioclient.InferenceServerClient(args.url)
    await client.infer(args.model, inputs)  # warm up
    worker = _stream_worker if args.stream else _unary_worker
    latencies: list[float] = []
    start = time.perf_counter()
    stop_at = start + args.seconds
    await asyncio.gather(
        *(worker(client, args.model, inputs, stop_at, latencies) for _ in range(args.concurrency))
    )
    elapsed = time.perf_counter() - start
    await client.close()
    latencies.sort()
    count = len(latencies)

    def pct(p: float) -> float:
        return latencies[min(count - 1, int(count * p))] * 1000

    mode = "stream" if args.stream else "unary"
    print(
        f"{args.model} {mode} concurrency {args.concurrency}: {count / elapsed:,.0f} infer/s "
        f"({count} in {elapsed:.1f} s); latency ms p50 {pct(0.5):.2f} p90 {pct(0.9):.2f} "
        f"p99 {pct(0.99):.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="127.0.0.1:8001")
    parser.add_argument("--model", default="simple")
    parser.add_argument("--shape", default="1,16")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--uvloop", action="store_true", help="run the client on uvloop")
    args = parser.parse_args()
    if args.uvloop:
        import uvloop

        uvloop.install()
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
