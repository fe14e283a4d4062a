"""The frontend workers <-> core link under sustained load: the real server with frontend
workers and the link's message rings on, perf_analyzer's HTTP load on `simple` until the server
has served `--requests`; fails when a window reports an error, the requests stop, or the server's
log says a link message failed or a ring is corrupt (msgring.RingCorrupt logs the offsets, head,
tail and the bytes there).

    python bench/investigations/link_stress.py [--requests 200000] [--workers 2] [--concurrency 16]
                                [--protocol http] [--rings 1]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: benchlib
import benchlib
import perf

# What the core or a worker logs when the link broke.
BROKEN = ("a message on the link failed", "ring is corrupt", "message ring corrupt", "Traceback")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--protocol", default="http", choices=("http", "grpc"))
    parser.add_argument("--rings", default="1", help="OCEANUS_LINK_MSG_RINGS for the server")
    parser.add_argument("--window-ms", type=int, default=5000)
    args = parser.parse_args()
    pa = perf.find_perf_analyzer()
    if pa is None:
        print("perf_analyzer not found: run scripts/install_perf_analyzer.sh", file=sys.stderr)
        return 1
    repository = benchlib.example_repository(["simple"])
    log_dir = benchlib.RESULTS_DIR / f"link-stress-{time.strftime('%Y%m%d-%H%M%S')}-logs"
    with benchlib.oceanus_server(
        repository,
        log_dir,
        tag="stress",
        extra=[f"--frontend-workers={args.workers}"],
        env={"OCEANUS_LINK_MSG_RINGS": args.rings},
    ) as server:
        url = server.http_url if args.protocol == "http" else server.grpc_url
        assert url is not None
        served = 0
        while served < args.requests:
            row = perf.run_level(
                pa[0],
                pa[1],
                "simple",
                url,
                args.concurrency,
                protocol=args.protocol,
                window_ms=args.window_ms,
            )
            now = benchlib.model_stats(server.http_url, "simple")["inference_count"]
            log = server.log_path.read_text(errors="replace")
            broken = [line for line in log.splitlines() if any(b in line for b in BROKEN)]
            print(f"served {now}: {row.get('throughput')} infer/s, error {row.get('error')}")
            if row.get("error") or broken or now <= served:
                print("FAILED:", *(broken[:5] or [row.get("error") or "no progress"]), sep="\n")
                print(log[-4000:])
                return 1
            served = now
    print(f"PASSED: {served} requests, no link error (log: {log_dir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
