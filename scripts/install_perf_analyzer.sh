#!/usr/bin/env bash
# Install NVIDIA's perf_analyzer, the load generator Triton users measure with, for Oceanus' tests,
# benchmarks and README. The x86-64 Linux wheel of tritonclient 2.51.0 carries the binary (pip puts
# it in the venv's bin/); it needs Debian's libb64 (apt) and libcudart.so.12 from PyPI's
# nvidia-cuda-runtime-cu12, and no GPU. scripts/perf_analyzer.sh runs it.
#
#   bash scripts/install_perf_analyzer.sh [VENV]
#
# VENV defaults to $PA_VENV, else ${OCEANUS_CACHE_DIR:-~/.cache/oceanus}/perf_analyzer. A working
# install there is left alone. Env: PYTHON (default python3); SKIP_APT=1 never calls apt-get.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=${1:-${PA_VENV:-${OCEANUS_CACHE_DIR:-$HOME/.cache/oceanus}/perf_analyzer}}

if PA_VENV="$venv" bash "$here/perf_analyzer.sh" --version >/dev/null 2>&1; then
  echo "perf_analyzer is installed in $venv"
  exit 0
fi
if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
  echo "perf_analyzer ships only in tritonclient's x86-64 Linux wheel; not on $(uname -s)-$(uname -m)" >&2
  exit 1
fi

if ! ldconfig -p 2>/dev/null | grep -q 'libb64\.so\.0d'; then
  if [ "${SKIP_APT:-0}" = 1 ] || ! command -v apt-get >/dev/null; then
    echo "perf_analyzer needs libb64.so.0d (Debian/Ubuntu package libb64-0d); install it first" >&2
    exit 1
  fi
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  echo "installing libb64-0d with apt-get"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq libb64-0d >/dev/null
fi

if [ ! -x "$venv/bin/python" ]; then
  echo "creating $venv"
  mkdir -p "$(dirname "$venv")"
  "${PYTHON:-python3}" -m venv "$venv"
fi
echo "installing tritonclient==2.51.0 (it carries perf_analyzer) and nvidia-cuda-runtime-cu12 into $venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --only-binary=:all: \
  "tritonclient==2.51.0" "nvidia-cuda-runtime-cu12>=12,<13"

if ! PA_VENV="$venv" bash "$here/perf_analyzer.sh" --version; then
  echo "perf_analyzer was installed in $venv but does not start (see above)" >&2
  exit 1
fi
echo "perf_analyzer is ready: bash scripts/perf_analyzer.sh -m simple -u localhost:8000"
