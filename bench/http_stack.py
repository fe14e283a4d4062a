"""The HTTP stack alone: Oceanus' own httptools protocol vs uvicorn (raw ASGI), same handler.

oceanus/frontends/http/protocol.py replaced uvicorn on the inference path; this is the
measurement behind that choice, kept runnable. Both servers answer perf_analyzer with the same
handler for a fake KServe model "echo" (metadata, config, stats, and an infer that returns the
input tensor as the output, binary), with no core behind it, so the numbers are the cost of the
stacks themselves: parsing, dispatch, writing. Both run on uvloop with the httptools parser, one
process each, started and measured alternately (noise hits both alike); medians are printed
and written to bench/results/http-stack-<timestamp>.json with the exact perf_analyzer commands.

    python bench/http_stack.py [--repeat 3] [--concurrency 16] [--window-ms 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).parent))
import benchlib
import perf

from oceanus.core.observability.statistics import ModelStatistics

Answer = tuple[int, list[tuple[bytes, bytes]], bytes]
JSON = [(b"content-type", b"application/json")]
METADATA = orjson.dumps(
    {
        "name": "echo",
        "versions": ["1"],
        "platform": "python",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 16]}],
    }
)
CONFIG = orjson.dumps(
    {
        "name": "echo",
        "backend": "python",
        "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]}],
    }
)
STATS = orjson.dumps({"model_stats": [ModelStatistics().as_dict("echo", "1")]})
STACKS = ("oceanus", "uvicorn")


def answer(method: str, path: str, headers: dict[bytes, bytes], body: bytes) -> Answer:
    """The one handler both stacks serve."""
    if path == "/v2/models/echo/infer" and method == "POST":
        length = int(headers.get(b"inference-header-content-length", b"0"))
        header = orjson.loads(body[:length] if length else body)
        data = body[length:] if length else np.asarray(header["inputs"][0]["data"], "<f4").tobytes()
        document = {
            "model_name": "echo",
            "model_version": "1",
            "outputs": [
                {
                    "name": "OUTPUT0",
                    "datatype": "FP32",
                    "shape": header["inputs"][0]["shape"],
                    "parameters": {"binary_data_size": len(data)},
                }
            ],
        }
        head = orjson.dumps(document)
        return (
            200,
            [
                (b"content-type", b"application/octet-stream"),
                (b"inference-header-content-length", b"%d" % len(head)),
            ],
            head + data,
        )
    if method != "GET":
        return 405, JSON, b'{"error":"Method Not Allowed"}'
    if path in ("/v2/health/live", "/v2/health/ready", "/v2/models/echo/ready"):
        return 200, [], b""
    if path == "/v2/models/echo":
        return 200, JSON, METADATA
    if path == "/v2/models/echo/config":
        return 200, JSON, CONFIG
    if path in ("/v2/models/echo/stats", "/v2/models/stats"):
        return 200, JSON, STATS
    if path == "/v2":
        return 200, JSON, b'{"name":"echo","version":"0","extensions":[]}'
    return 404, JSON, b'{"error":"Not Found"}'


# ---- the two servers ----------------------------------------------------------------------------


def serve_oceanus(port: int) -> None:
    import uvloop

    from oceanus.frontends.http.protocol import HttpRequest, HttpResponse, HttpServer

    def handle(request: HttpRequest) -> HttpResponse:
        status, headers, body = answer(request.method, request.path, request.headers, request.body)
        return HttpResponse(status, body, headers)

    async def main() -> None:
        server = HttpServer(handle, 64 * 1024 * 1024)
        await server.start("127.0.0.1", port)
        await asyncio.Event().wait()

    uvloop.run(main())


Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def asgi_app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    """A raw ASGI app: no framework, so only uvicorn's own cost is measured."""
    if scope["type"] != "http":
        return
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    headers = dict(scope["headers"])
    status, out_headers, body = answer(scope["method"], scope["path"], headers, b"".join(chunks))
    out_headers = [*out_headers, (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": out_headers})
    await send({"type": "http.response.body", "body": body})


def serve_uvicorn(port: int) -> None:
    import uvicorn

    uvicorn.run(
        asgi_app,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
        lifespan="off",
    )


# ---- the measurement ----------------------------------------------------------------------------


def measure(
    stack: str, concurrency: int, window_ms: int, found: tuple[Path, dict[str, str]]
) -> Any:
    port = benchlib.free_port()
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", stack, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        benchlib.wait_http_ok(f"http://127.0.0.1:{port}/v2/health/ready", server, 60)
        binary, env = found
        return perf.run_level(
            binary, env, "echo", f"127.0.0.1:{port}", concurrency, window_ms=window_ms
        )
    finally:
        benchlib.stop_process(server)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", choices=STACKS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--window-ms", type=int, default=2000)
    args = parser.parse_args()
    if args.serve:
        (serve_oceanus if args.serve == "oceanus" else serve_uvicorn)(args.port)
        return 0
    found = perf.find_perf_analyzer()
    if found is None:
        print(f"perf_analyzer not found: run {perf.INSTALL_HINT}")
        return 1
    runs: dict[str, list[dict[str, Any]]] = {stack: [] for stack in STACKS}
    load_before = benchlib.loadavg()
    for round_index in range(args.repeat):
        for stack in STACKS if round_index % 2 == 0 else reversed(STACKS):
            result = measure(stack, args.concurrency, args.window_ms, found)
            runs[stack].append(result)
            print(f"round {round_index + 1} {stack:8s} {result.get('throughput', 0):8.0f} infer/s")
    medians = {
        stack: {
            "infer_per_s": benchlib.median([r.get("throughput", 0.0) for r in results]),
            "p50_ms": benchlib.median([r.get("p50_ms") or 0.0 for r in results]),
        }
        for stack, results in runs.items()
    }
    ratio = medians["oceanus"]["infer_per_s"] / max(medians["uvicorn"]["infer_per_s"], 1.0)
    print()
    print(
        benchlib.table(
            ["stack", "infer/s (median)", "p50 ms"],
            [[s, f"{m['infer_per_s']:.0f}", f"{m['p50_ms']:.2f}"] for s, m in medians.items()],
        )
    )
    print(
        f"oceanus / uvicorn: {ratio:.2f}x  (concurrency {args.concurrency}, median of "
        f"{args.repeat}; load average before: {load_before})"
    )
    benchlib.write_side_by_side(
        "http-stack", args, load_before, medians=medians, oceanus_over_uvicorn=ratio, runs=runs
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
