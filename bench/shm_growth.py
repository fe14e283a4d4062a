"""Python models in a container's 64 MB /dev/shm (issue 41): how many load and answer.

A repository of `--models` copies of a small identity model.py (FP32, 16 elements, dynamic
batching, one instance each). Each server runs alone in a private mount namespace whose /dev/shm
is a `--shm-mb` tmpfs (root: `unshare -m`), with `--exit-on-error=false`; once it is live, every
model gets one request over HTTP and the answer is checked. Printed per server: models ready,
answered correctly, and what /dev/shm holds (read through /proc/<pid>/root, so Triton is measured
the same way). Oceanus runs with `--frontend-workers` (default 2: their rings share the budget).

    python bench/shm_growth.py [--models 40] [--shm-mb 64] [--frontend-workers 2]
                               [--baseline OTHER_CHECKOUT] [--triton]

`--baseline` serves the same repository with the Oceanus of another checkout (before/after in one
run); `--triton` with the reference Triton 2.51 (../shared/triton-reference/start.sh; its first
use creates a venv). The mixed-traffic target (six 4 MiB models beside two small ones, 8 clients)
is `bench/reliability.py --phases shm`. Results go to bench/results/shm-growth-<ts>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import benchlib
from python_backend import MODEL_PY, START_REFERENCE

# The reference Triton's launcher and the identity model.py: python_backend.py's.
CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
dynamic_batching {{ }}
"""


def repository(root: Path, count: int) -> list[str]:
    names = [f"pyid{i:02d}" for i in range(count)]
    for name in names:
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(MODEL_PY)
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name))
    return names


def namespace(megabytes: int) -> list[str]:
    """A command running its arguments in a private mount namespace with a small /dev/shm."""
    mount = f"mount -t tmpfs -o size={megabytes}m tmpfs /dev/shm"
    return ["unshare", "-m", "sh", "-c", f'{mount} && exec "$@"', "sh"]


def shm_used(pid: int) -> int:
    stats = os.statvfs(f"/proc/{pid}/root/dev/shm")
    return (stats.f_blocks - stats.f_bfree) * stats.f_frsize


def ask(http: int, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{http}{path}", data=body)
    if body is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def drive(http: int, names: list[str]) -> dict[str, Any]:
    """One request per model (JSON over HTTP), each answer checked."""
    ready = answered = 0
    errors: dict[str, int] = {}
    for i, name in enumerate(names):
        if ask(http, f"/v2/models/{name}/ready")[0] == 200:
            ready += 1
        data = (np.arange(16, dtype=np.float32) + i).tolist()
        body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": data}]}
        status, reply = ask(http, f"/v2/models/{name}/infer", json.dumps(body).encode())
        if status == 200 and json.loads(reply)["outputs"][0]["data"] == data:
            answered += 1
        else:
            errors[str(status)] = errors.get(str(status), 0) + 1
    return {"ready": ready, "answered": answered, "errors": errors}


def run_oceanus(
    repo: Path, names: list[str], args: argparse.Namespace, checkout: Path, log: Path
) -> dict[str, Any]:
    http, grpc_port = benchlib.free_port(), benchlib.free_port()
    argv = [
        *namespace(args.shm_mb),
        sys.executable,
        "-m",
        "oceanus",
        f"--model-repository={repo}",
        f"--http-port={http}",
        f"--grpc-port={grpc_port}",
        "--allow-metrics=false",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--exit-on-error=false",
        f"--frontend-workers={args.frontend_workers}",
    ]
    started = time.monotonic()
    with log.open("wb") as out:
        # From the checkout measured: `python -m` puts the working directory first on the path.
        process = subprocess.Popen(
            argv,
            cwd=checkout,
            env=dict(os.environ, PYTHONPATH=str(checkout)),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        benchlib.wait_http_ok(f"http://127.0.0.1:{http}/v2/health/live", process, 900)
        live_s = time.monotonic() - started
        result = drive(http, names)
        result["shm_used_mib"] = round(shm_used(process.pid) / (1 << 20), 1)
        result["live_s"] = round(live_s, 1)
        text = log.read_text(errors="replace")
        result["sigbus"] = text.count("SIGBUS")
        result["reserve_errors"] = text.count("failed to reserve shared memory")
        return result
    finally:
        benchlib.stop_process(process)


def run_triton(repo: Path, names: list[str], args: argparse.Namespace) -> dict[str, Any]:
    http, grpc_port, metrics = (benchlib.free_port() for _ in range(3))
    started = time.monotonic()
    out = subprocess.run(
        [
            *namespace(args.shm_mb),
            "bash",
            str(START_REFERENCE),
            str(repo),
            str(http),
            str(grpc_port),
            str(metrics),
            "--",
            "--exit-on-error=false",
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        check=True,
        cwd=repo,
    )
    pid = int(out.stdout.strip().splitlines()[-1])
    try:
        benchlib.wait_http_ok(f"http://127.0.0.1:{http}/v2/health/live", None, 900)
        live_s = time.monotonic() - started
        result = drive(http, names)
        result["shm_used_mib"] = round(shm_used(pid) / (1 << 20), 1)
        result["live_s"] = round(live_s, 1)
        return result
    finally:
        os.kill(pid, 15)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=40)
    parser.add_argument("--shm-mb", type=int, default=64)
    parser.add_argument("--frontend-workers", default="2")
    parser.add_argument("--baseline", type=Path, help="another checkout to serve beside this one")
    parser.add_argument("--triton", action="store_true", help="also the reference Triton 2.51")
    args = parser.parse_args()
    rows: dict[str, dict[str, Any]] = {}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_dir = benchlib.RESULTS_DIR / f"shm-growth-{stamp}-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="oceanus-shm-growth-") as tmp:
        repo = Path(tmp) / "repo"
        names = repository(repo, args.models)
        rows["oceanus"] = run_oceanus(repo, names, args, benchlib.ROOT, log_dir / "oceanus.log")
        print("oceanus", json.dumps(rows["oceanus"]), flush=True)
        if args.baseline is not None:
            rows["baseline"] = run_oceanus(
                repo, names, args, args.baseline.resolve(), log_dir / "baseline.log"
            )
            print("baseline", json.dumps(rows["baseline"]), flush=True)
        if args.triton:
            rows["triton"] = run_triton(repo, names, args)
            print("triton", json.dumps(rows["triton"]), flush=True)
    path = benchlib.RESULTS_DIR / f"shm-growth-{stamp}.json"
    record = {"command": " ".join(sys.argv), "args": vars(args) | {"baseline": str(args.baseline)}}
    path.write_text(json.dumps({**record, "servers": rows}, indent=2) + "\n")
    print(
        benchlib.table(
            ["server", "ready", "answered", "/dev/shm used MiB", "live after s", "errors"],
            [
                [
                    name,
                    f"{r['ready']}/{args.models}",
                    f"{r['answered']}/{args.models}",
                    r["shm_used_mib"],
                    r["live_s"],
                    ", ".join(f"{k}: {v}" for k, v in r["errors"].items()) or "0",
                ]
                for name, r in rows.items()
            ],
        )
    )
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
