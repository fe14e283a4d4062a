"""NVIDIA's perf_analyzer runs cleanly against Oceanus over HTTP and gRPC, server-side columns
included (it reads /v2 extensions and /v2/models/<m>/stats around each window).

scripts/test.sh installs perf_analyzer with scripts/install_perf_analyzer.sh, so these run on a
fresh clone; they skip, saying why, only where that install could not happen (no x86-64 Linux,
no network, OCEANUS_SKIP_PERF_ANALYZER)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.frontends.http.test_http_endpoints import raw

ROOT = Path(__file__).resolve().parents[1]
PA_SCRIPT = ROOT / "scripts" / "perf_analyzer.sh"


def pa_venv() -> Path:
    """Where scripts/install_perf_analyzer.sh puts perf_analyzer (the same rule as the scripts)."""
    if os.environ.get("PA_VENV"):
        return Path(os.environ["PA_VENV"])
    cache = os.environ.get("OCEANUS_CACHE_DIR") or str(Path.home() / ".cache" / "oceanus")
    return Path(cache) / "perf_analyzer"


PA_VENV = pa_venv()

pytestmark = pytest.mark.skipif(
    not (PA_VENV / "bin" / "perf_analyzer").exists(),
    reason=f"perf_analyzer is not installed in {PA_VENV}: bash scripts/install_perf_analyzer.sh",
)


@pytest.fixture(scope="module")
def pa_server(model_repository: Path, launch_module: Any) -> Any:
    return launch_module([model_repository], ["--allow-metrics=false"])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_short_run(pa_server: Any, protocol: str) -> None:
    url = pa_server.http_url if protocol == "http" else pa_server.grpc_url
    result = subprocess.run(
        [
            "bash",
            str(PA_SCRIPT),
            "-m",
            "simple_dyna",
            "-u",
            url,
            "-i",
            protocol,
            "--concurrency-range",
            "4",
            "--measurement-mode",
            "count_windows",
            "--measurement-request-count",
            "100",
            # Any three windows count as stable: this checks the protocol, not the machine's noise
            # (a loaded 2-core machine fails 100 % now and then).
            "--stability-percentage",
            "1000",
            "--max-trials",
            "10",  # a stable run ends after 3 windows; a busy machine gets more tries
        ],
        env={**os.environ, "PA_VENV": str(PA_VENV)},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Throughput:" in result.stdout
    # server-side columns come from our /stats
    assert "Server:" in result.stdout
    assert "Inference count:" in result.stdout


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_system_shared_memory(pa_server: Any, protocol: str) -> None:
    """--shared-memory=system: perf_analyzer registers a region per tensor, sends every input and
    receives every output through them, and unregisters them all at the end."""
    url = pa_server.http_url if protocol == "http" else pa_server.grpc_url
    result = subprocess.run(
        [
            "bash",
            str(PA_SCRIPT),
            "-m",
            "simple",
            "-u",
            url,
            "-i",
            protocol,
            "--shared-memory=system",
            "--concurrency-range",
            "2",
            "--measurement-mode",
            "count_windows",
            "--measurement-request-count",
            "100",
            # Any three windows count as stable: this checks the protocol, not the machine's noise
            # (a loaded 2-core machine fails 100 % now and then).
            "--stability-percentage",
            "1000",
            "--max-trials",
            "10",  # a stable run ends after 3 windows; a busy machine gets more tries
        ],
        env={**os.environ, "PA_VENV": str(PA_VENV)},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Throughput:" in result.stdout
    status, _, body = raw(pa_server, "GET", "/v2/systemsharedmemory/status")
    assert (status, body) == (200, b"[]")  # all unregistered again
