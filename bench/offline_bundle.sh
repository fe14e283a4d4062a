#!/usr/bin/env bash
# Benchmarks on a machine without a network (a lent many-core or GPU machine that has Python,
# numpy, onnx, onnxruntime, uvloop and prometheus_client but no package index): make a bundle
# here, carry it beside the checkout, install it there.
#
#   bash bench/offline_bundle.sh make DIR [PYTHON_VERSION]          # here, with a network (3.12)
#   eval "$(bash bench/offline_bundle.sh install DIR)"             # there, in the repository root
#
# `make` downloads the wheels the server and the benches need that such an image may lack or
# hold in versions too old for tritonclient's generated protos (orjson, httptools, uvicorn,
# tritonclient, protobuf, grpcio, hpack, py-spy; h2 and hyperframe only for a --baseline
# checkout from before the gRPC transport framed HTTP/2 itself) for that Python on x86-64 Linux,
# and perf_analyzer:
# tritonclient 2.51's wheel (it carries the binary), libb64 and libcudart.so.12 from this
# machine's perf_analyzer install (scripts/install_perf_analyzer.sh). About 30 MB.
# `install` puts the wheels into that machine's Python (a throwaway machine: they replace what
# its image has), unpacks perf_analyzer into a venv-shaped folder and prints the exports (PATH
# with a `python` for that interpreter, PA_VENV, PYTHONPATH) for the caller to eval, so bench/scaling_device.sh, bench/workers.py and bench/python_backend.py run as
# they do here (a --baseline checkout too: its servers get PYTHONPATH=<checkout> and find the
# installed wheels).
set -uo pipefail
action=${1:?make or install}
dir=${2:?the bundle folder}

case "$action" in
  make)
    version=${3:-3.12}
    mkdir -p "$dir/whl" "$dir/lib"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$version" \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 \
      -d "$dir/whl" orjson httptools uvicorn "tritonclient==$(python3 -c \
      'import importlib.metadata as m; print(m.version("tritonclient"))')" \
      "protobuf==$(python3 -c 'import google.protobuf as p; print(p.__version__)')" \
      "grpcio==$(python3 -c 'import grpc; print(grpc.__version__)')" py-spy h2 hpack hyperframe \
      || exit 1
    python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux1_x86_64 \
      --python-version "$version" -d "$dir" tritonclient==2.51.0 || exit 1
    mv "$dir"/tritonclient-2.51.0-*.whl "$dir/perf_analyzer-tritonclient-2.51.0.whl"
    pa=${PA_VENV:-${OCEANUS_CACHE_DIR:-$HOME/.cache/oceanus}/perf_analyzer}
    cp -L "$(ldconfig -p | awk '/libb64\.so\.0d/ {print $NF; exit}')" "$dir/lib/" || exit 1
    cp -L "$pa"/lib/python3*/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12 "$dir/lib/" \
      || { echo "no libcudart.so.12 in $pa: run scripts/install_perf_analyzer.sh" >&2; exit 1; }
    du -sh "$dir"
    ;;
  install)
    py=$(command -v python3)
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      "$dir"/whl/*.whl >&2 || exit 1
    bin=$(mktemp -d)
    # `python` for the benches: the interpreter that has the wheels.
    printf '#!/bin/sh\nexec %s "$@"\n' "$py" > "$bin/python" && chmod +x "$bin/python"
    pa=$(mktemp -d)/perf_analyzer
    lib=$pa/lib/python3/site-packages/nvidia/cuda_runtime/lib
    mkdir -p "$pa/bin" "$lib" && cp "$dir"/lib/* "$lib/"
    "$py" - "$dir/perf_analyzer-tritonclient-2.51.0.whl" "$pa/bin/perf_analyzer" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel, open(sys.argv[2], "wb") as out:
    shutil.copyfileobj(wheel.open("tritonclient-2.51.0.data/data/bin/perf_analyzer"), out)
PY
    chmod +x "$pa/bin/perf_analyzer"
    PA_VENV="$pa" bash scripts/perf_analyzer.sh --version | head -1 >&2
    PYTHONPATH="$PWD" "$py" -c "import oceanus, orjson, httptools, tritonclient.grpc" || exit 1
    echo "export PATH='$bin':\"\$PATH\" PA_VENV='$pa' PYTHONPATH='$PWD'"
    ;;
  *)
    echo "usage: offline_bundle.sh make|install DIR" >&2
    exit 2
    ;;
esac
