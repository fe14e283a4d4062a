#!/usr/bin/env bash
# Run the perf_analyzer that scripts/install_perf_analyzer.sh installed, with its CUDA runtime
# library on LD_LIBRARY_PATH. Arguments are perf_analyzer's own, e.g.
#
#   bash scripts/perf_analyzer.sh -m simple -u localhost:8000 --concurrency-range 1:4
#
# The venv: $PA_VENV, else ${OCEANUS_CACHE_DIR:-~/.cache/oceanus}/perf_analyzer.
set -euo pipefail
venv=${PA_VENV:-${OCEANUS_CACHE_DIR:-$HOME/.cache/oceanus}/perf_analyzer}
binary="$venv/bin/perf_analyzer"
if [ ! -x "$binary" ]; then
  echo "perf_analyzer is not installed in $venv: run bash scripts/install_perf_analyzer.sh" >&2
  exit 127
fi
shopt -s nullglob
libdirs=("$venv"/lib/python3*/site-packages/nvidia/cuda_runtime/lib)
shopt -u nullglob
if [ "${#libdirs[@]}" -eq 0 ]; then
  echo "libcudart is missing from $venv: run bash scripts/install_perf_analyzer.sh" >&2
  exit 127
fi
export LD_LIBRARY_PATH="${libdirs[0]}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$binary" "$@"
