#!/usr/bin/env bash
# How far frontend workers scale on a many-core machine (issue 27): requests/s and CPU-µs per
# request per process role (core, frontend workers) for `simple` over HTTP and gRPC with 0, 2, 4,
# 8 and 14 frontend workers, side by side in one run (bench/workers.py: servers up at once,
# measured in turn each round, medians). Made for a 16-core device machine in one call:
#
#   bash bench/scaling_device.sh            # from the repository root, ~5 minutes
#
# Needs the project installed (pip install -e .[bench]) and perf_analyzer
# (scripts/install_perf_analyzer.sh). On a machine without a network: `bash
# bench/offline_bundle.sh make DIR` here, carry DIR, `eval "$(bash bench/offline_bundle.sh
# install DIR)"` there. Env: WORKERS (default 0,2,4,8,14), REPEAT (2), WINDOW_MS (2000),
# CONCURRENCY (64: enough clients to keep 14 workers and the core busy), RINGS=1 (each worker
# count twice: the link's messages over the socket and in shared-memory rings). The table goes to
# stdout and bench/results/workers-<timestamp>.json; copy it into bench/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "machine: $(nproc) CPUs usable, load $(cut -d' ' -f1-3 /proc/loadavg), $(uname -r)"
if ! python -c "import oceanus" 2>/dev/null; then
  echo "oceanus is not importable: pip install -e .[bench] (or set PYTHONPATH to the checkout)" >&2
  exit 1
fi
exec python bench/workers.py \
  --workers "${WORKERS:-0,2,4,8,14}" \
  --repeat "${REPEAT:-2}" \
  --window-ms "${WINDOW_MS:-2000}" \
  --concurrency "${CONCURRENCY:-64}" \
  --points simple/http,simple/grpc \
  --no-echo \
  $([ "${RINGS:-0}" = 1 ] && echo --rings)
