"""Reliability figures (issue 18): many connections, overload, faults and a soak, one table.

Phases (each on its own server, started and stopped here; `--phases` picks some):

* `connections`: 512 HTTP keep-alive connections and 256 gRPC channels on `simple`, each one
  request in flight, for `--seconds`;
* `overload`: `slow_fp32` with `max_queue_size: 4` under 64 concurrent clients: excess requests
  must get 503 quickly, memory flat;
* `fault`: a Python model whose stub process is killed (SIGKILL) mid-request: the clients get a
  clear error, the model is not ready until a new stub is up (the time is measured), then serves;
* `reload`: `simple_dyna` reloaded every 0.5 s (explicit mode) under steady load: no failure;
* `soak`: mixed traffic (HTTP JSON and binary, gRPC unary and streams, reloads) for
  `--soak-seconds` (default 600): RSS and open file descriptors of every server process are
  sampled; after a warm-up they must stay within 5 %;
* `shm`: a container's small /dev/shm (issue 30): the server alone in a mount namespace whose
  /dev/shm is a `--shm-mb` tmpfs (root: `unshare -m`), two small Python models and six taking
  4 MiB tensors (more rings than the budget holds), 8 gRPC clients checking every answer for
  `--seconds`: SIGBUS and stub restarts (from the log), wrong answers, refusals by code, how
  many models loaded and how many of those served, and whether the server is alive at the end.

For each phase: requests, failures by cause (HTTP status or gRPC code, or the exception), p50 and
p99 latency, RSS and open fds (all server processes: core and frontend workers) at start, peak
and after the load stopped. Printed as a table, written to bench/results/reliability-<ts>.json.

    python bench/reliability.py [--phases connections,overload,fault,reload] [--seconds 20]
    python bench/reliability.py --phases soak --soak-seconds 600
    python bench/reliability.py --phases shm --shm-mb 64 --seconds 180
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb

sys.path.insert(0, str(Path(__file__).parent))
import benchlib
from reliability_clients import (
    HttpClient,
    Recorder,
    closed_loop,
    grpc_call,
    http_call,
    server_pids,
)

SIMPLE_BODY = json.dumps(
    {
        "inputs": [
            {"name": n, "datatype": "INT32", "shape": [1, 16], "data": [1] * 16}
            for n in ("INPUT0", "INPUT1")
        ]
    }
).encode()
FP32_BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]}
).encode()
IDENTITY_PY = """import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.05)
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
"""
IDENTITY_CONFIG = """name: "pyident"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""


# ---- phases --------------------------------------------------------------------------------


async def phase_connections(server: benchlib.Server, seconds: float) -> dict[str, Any]:
    recorder = Recorder(server.proc.pid)
    sampler = asyncio.ensure_future(recorder.sampler())
    stop_at = time.monotonic() + seconds
    calls = [
        http_call(HttpClient(server.http_port), "/v2/models/simple/infer", SIMPLE_BODY)
        for _ in range(512)
    ]
    assert server.grpc_url is not None
    channels = [grpc.aio.insecure_channel(server.grpc_url) for _ in range(256)]
    calls += [grpc_call(channel) for channel in channels]
    await asyncio.gather(*(closed_loop(recorder, call, stop_at) for call in calls))
    sampler.cancel()
    for channel in channels:
        await channel.close()
    return await recorder.row("512 HTTP + 256 gRPC connections")


async def phase_overload(server: benchlib.Server, seconds: float) -> dict[str, Any]:
    recorder = Recorder(server.proc.pid)
    sampler = asyncio.ensure_future(recorder.sampler())
    stop_at = time.monotonic() + seconds
    calls = [
        http_call(HttpClient(server.http_port), "/v2/models/slow_queue/infer", FP32_BODY)
        for _ in range(64)
    ]
    await asyncio.gather(*(closed_loop(recorder, call, stop_at) for call in calls))
    sampler.cancel()
    return await recorder.row("overload: 64 clients, max_queue_size 4")


async def phase_fault(server: benchlib.Server, seconds: float) -> dict[str, Any]:
    """Kill the Python model's stub while requests run; time until it serves again."""
    recorder = Recorder(server.proc.pid)
    stop_at = time.monotonic() + seconds
    calls = [
        http_call(HttpClient(server.http_port), "/v2/models/pyident/infer", FP32_BODY)
        for _ in range(8)
    ]
    load = asyncio.gather(*(closed_loop(recorder, call, stop_at) for call in calls))
    await asyncio.sleep(seconds / 3)
    stubs = [
        pid
        for pid in server_pids(server.proc.pid)
        if b"oceanus.backends.python.pb_stub" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    killed_at = time.monotonic()
    for pid in stubs:
        os.kill(pid, signal.SIGKILL)
    ready_again = None
    probe = HttpClient(server.http_port)
    await asyncio.sleep(0.05)
    while time.monotonic() < killed_at + 60:
        status = await probe.get("/v2/models/pyident/ready")
        if status == 200:
            ready_again = time.monotonic() - killed_at
            break
        await asyncio.sleep(0.01)
    await load
    return await recorder.row(
        "fault: Python stub SIGKILL under load",
        {"stubs_killed": len(stubs), "ready_again_s": round(ready_again or -1, 3)},
    )


async def phase_reload(server: benchlib.Server, seconds: float) -> dict[str, Any]:
    recorder = Recorder(server.proc.pid)
    stop_at = time.monotonic() + seconds
    calls = [
        http_call(HttpClient(server.http_port), "/v2/models/simple_dyna/infer", SIMPLE_BODY)
        for _ in range(16)
    ]
    load = asyncio.gather(*(closed_loop(recorder, call, stop_at) for call in calls))
    control = HttpClient(server.http_port)
    reloads = 0
    while time.monotonic() < stop_at - 1:
        status = await control.post("/v2/repository/models/simple_dyna/load", b"")
        reloads += status == 200
        await asyncio.sleep(0.5)
    await load
    return await recorder.row("reload every 0.5 s under load", {"reloads": reloads})


async def phase_soak(server: benchlib.Server, seconds: float) -> dict[str, Any]:
    recorder = Recorder(server.proc.pid)
    sampler = asyncio.ensure_future(recorder.sampler(5.0))
    stop_at = time.monotonic() + seconds
    assert server.grpc_url is not None
    channels = [grpc.aio.insecure_channel(server.grpc_url) for _ in range(8)]
    calls = [
        http_call(HttpClient(server.http_port), "/v2/models/simple/infer", SIMPLE_BODY)
        for _ in range(8)
    ]
    calls += [
        http_call(HttpClient(server.http_port), "/v2/models/simple_dyna/infer", SIMPLE_BODY)
        for _ in range(8)
    ]
    calls += [grpc_call(channel) for channel in channels]
    load = asyncio.gather(*(closed_loop(recorder, call, stop_at) for call in calls))
    control = HttpClient(server.http_port)
    while time.monotonic() < stop_at - 5:
        await control.post("/v2/repository/models/simple_dyna/load", b"")
        await asyncio.sleep(10)
    await load
    sampler.cancel()
    for channel in channels:
        await channel.close()
    warm = [s for s in recorder.samples if s[0] >= recorder.samples[0][0] + seconds / 5]
    growth = {}
    if warm:
        growth = {
            "rss_growth_pct": round(100 * (max(s[1] for s in warm) / warm[0][1] - 1), 1),
            "fd_growth_pct": round(100 * (max(s[2] for s in warm) / warm[0][2] - 1), 1),
        }
    return await recorder.row(f"soak {seconds:.0f} s mixed", growth)


SHM_SMALL, SHM_BIG = ("pysmall0", "pysmall1"), tuple(f"pybig{i}" for i in range(6))


def shm_repository(root: Path) -> Path:
    for name in SHM_SMALL + SHM_BIG:
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(IDENTITY_PY.replace("time.sleep(0.05)", "0"))
        config = IDENTITY_CONFIG.replace('"pyident"', f'"{name}"')
        config = config.replace("max_batch_size: 8", "max_batch_size: 0")
        (root / name / "config.pbtxt").write_text(config.replace("[ 16 ]", "[ -1 ]"))
    return root


def shm_wrap(megabytes: int) -> list[str]:
    """A command running its arguments in a private mount namespace with a small /dev/shm."""
    mount = f"mount -t tmpfs -o size={megabytes}m tmpfs /dev/shm"
    return ["unshare", "-m", "sh", "-c", f'{mount} && exec "$@"', "sh"]


def checked_grpc_call(
    channel: grpc.aio.Channel, models: tuple[str, ...], elements: int, served: Counter[str]
) -> Callable[[], Awaitable[str | None]]:
    """Identity requests over the models in turn; a wrong answer is a failure of its own."""
    method = channel.unary_unary(
        "/inference.GRPCInferenceService/ModelInfer",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=pb.ModelInferResponse.FromString,
    )
    data = np.random.default_rng(elements).random(elements, dtype=np.float32).tobytes()
    turn = iter(range(1 << 62))

    async def call() -> str | None:
        model = models[next(turn) % len(models)]
        request = pb.ModelInferRequest(model_name=model)
        request.inputs.add(name="INPUT0", datatype="FP32", shape=[elements])
        request.raw_input_contents.append(data)
        try:
            answer = await method(request, timeout=60)
        except grpc.aio.AioRpcError as error:
            return f"gRPC {error.code().name}"
        if answer.raw_output_contents[0] != data:
            return "wrong output"
        served[model] += 1
        return None

    return call


async def phase_shm(server: benchlib.Server, seconds: float) -> dict[str, Any]:
    recorder = Recorder(server.proc.pid)
    sampler = asyncio.ensure_future(recorder.sampler())
    stop_at = time.monotonic() + seconds
    served: Counter[str] = Counter()
    loaded = [
        m
        for m in SHM_SMALL + SHM_BIG
        if await HttpClient(server.http_port).get(f"/v2/models/{m}/ready") == 200
    ]
    assert server.grpc_url is not None
    unlimited = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    channels = [grpc.aio.insecure_channel(server.grpc_url, options=unlimited) for _ in range(8)]
    calls = [checked_grpc_call(c, SHM_SMALL, 16, served) for c in channels[:2]]
    calls += [checked_grpc_call(c, SHM_BIG, 1 << 20, served) for c in channels[2:]]
    await asyncio.gather(*(closed_loop(recorder, call, stop_at) for call in calls))
    sampler.cancel()
    for channel in channels:
        await channel.close()
    alive = server.proc.poll() is None
    log = server.log_path.read_text(errors="replace")
    return await recorder.row(
        f"shm: /dev/shm {SHM_MB} MB, 8 Python models{SHM_RING}",
        {
            "alive": alive,
            "sigbus": log.count("SIGBUS"),
            "stub_restarts": log.count("stub process restarted"),
            "models_loaded": len(loaded),
            "served": dict(sorted(served.items())),
            "loaded_serving": sum(served[m] > 0 for m in loaded),
            "reserve_errors": sum(
                "failed to load" in line and "failed to reserve shared memory" in line
                for line in log.splitlines()
            ),
        },
    )


# ---- main ----------------------------------------------------------------------------------


def repository(root: Path) -> Path:
    source = benchlib.example_repository(["simple", "simple_dyna", "slow_fp32"])
    for name in ("simple", "simple_dyna"):
        shutil.copytree(source / name, root / name)
    slow = root / "slow_queue"
    shutil.copytree(source / "slow_fp32", slow)
    config = (slow / "config.pbtxt").read_text().replace('"slow_fp32"', '"slow_queue"')
    config += "\ndynamic_batching { default_queue_policy { max_queue_size: 4 } }\n"
    (slow / "config.pbtxt").write_text(config)
    (root / "pyident" / "1").mkdir(parents=True)
    (root / "pyident" / "config.pbtxt").write_text(IDENTITY_CONFIG)
    (root / "pyident" / "1" / "model.py").write_text(IDENTITY_PY)
    return root


# The figures the table has a column for (the rest go to its last column).
_COLUMNS = {"phase", "requests", "failures", "p50_ms", "p99_ms", "failure_p99_ms", "rss_mib", "fds"}

PHASES = {
    "connections": phase_connections,
    "overload": phase_overload,
    "fault": phase_fault,
    "reload": phase_reload,
    "soak": phase_soak,
    "shm": phase_shm,
}
SHM_MB = 64
SHM_RING = ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phases", default="connections,overload,fault,reload")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--soak-seconds", type=float, default=600.0)
    parser.add_argument("--frontend-workers", default="auto")
    parser.add_argument("--shm-mb", type=int, default=64, help="/dev/shm size of the shm phase")
    parser.add_argument(
        "--shm-ring-bytes",
        type=int,
        default=0,
        help="shm phase: shm-default-byte-size (0: the default, 1 MiB for both rings)",
    )
    args = parser.parse_args()
    global SHM_MB, SHM_RING
    SHM_MB = args.shm_mb
    SHM_RING = f", stub shm {args.shm_ring_bytes >> 10} KiB" if args.shm_ring_bytes else ""
    rows = []
    load_before = benchlib.loadavg()
    with tempfile.TemporaryDirectory(prefix="oceanus-reliability-") as tmp:
        repo = repository(Path(tmp) / "repo")
        log_dir = benchlib.RESULTS_DIR / f"reliability-{time.strftime('%Y%m%d-%H%M%S')}-logs"
        for phase in args.phases.split(","):
            extra = [f"--frontend-workers={args.frontend_workers}"]
            if phase in ("reload", "soak"):
                extra += ["--model-control-mode=explicit", "--load-model=*"]
            seconds = args.soak_seconds if phase == "soak" else args.seconds
            wrap: list[str] = []
            phase_repo = repo
            if phase == "shm":
                phase_repo = shm_repository(Path(tmp) / "shm-repo")
                wrap = shm_wrap(args.shm_mb)
                extra += ["--exit-on-error=false", "--strict-readiness=false"]
                if args.shm_ring_bytes:
                    extra.append(
                        f"--backend-config=python,shm-default-byte-size={args.shm_ring_bytes}"
                    )
            with benchlib.oceanus_server(
                phase_repo, log_dir, tag=phase, extra=extra, wrap=wrap
            ) as server:
                row = asyncio.run(PHASES[phase](server, seconds))
            rows.append(row)
            print(json.dumps(row))
    args.concurrency = None
    args.window_ms = None
    args.repeat = 1
    benchlib.write_side_by_side("reliability", args, load_before, phases=rows)
    print(
        benchlib.table(
            [
                "phase",
                "requests",
                "failures",
                "p50 ms",
                "p99 ms",
                "refusal p99 ms",
                "RSS MiB start/peak/after",
                "fds start/peak/after",
                "more",
            ],
            [
                [
                    r["phase"],
                    r["requests"],
                    ", ".join(f"{k}: {v}" for k, v in r["failures"].items()) or "0",
                    benchlib.fmt_num(r["p50_ms"], 2),
                    benchlib.fmt_num(r["p99_ms"], 2),
                    benchlib.fmt_num(r["failure_p99_ms"], 2),
                    "/".join(str(v) for v in r["rss_mib"]),
                    "/".join(str(v) for v in r["fds"]),
                    ", ".join(f"{k}={v}" for k, v in r.items() if k not in _COLUMNS),
                ]
                for r in rows
            ],
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
