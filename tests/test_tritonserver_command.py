"""`tritonserver` is Oceanus under Triton's name: the launch lines of KServe's runtime and of
NVIDIA's Helm charts parse, and KServe's serves a repository over HTTP and gRPC."""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from oceanus.cli import parse_args
from tests.conftest import ServerProcess

ROOT = Path(__file__).resolve().parents[1]

# Launch lines as the manifests write them (kserve config/runtimes/kserve-tritonserver.yaml;
# NVIDIA's server deploy/{k8s-onprem,aws,azure,gcp,fleetcommand,gke-marketplace-app} charts;
# KServe's multi-model serving adds explicit mode).
LAUNCH_LINES = [
    "--model-store=/mnt/models --grpc-port=9000 --http-port=8080 --allow-grpc=true "
    "--allow-http=true",
    "--model-store=/mnt/models --grpc-port=9000 --http-port=8080 --allow-grpc=true "
    "--allow-http=true --log-verbose=1 --model-control-mode=explicit",
    "--model-repository=/models",
    "--model-store=s3://bucket/models --model-control-mode=poll --repository-poll-secs=5",
    "--model-repository=/app/models --model-control-mode=POLL --log-verbose=1",
    "--model-store=gs://bucket/models --strict-model-config=False --log-verbose=0 "
    "--allow-gpu-metrics=True",
]


def test_tritonserver_is_the_same_program() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    scripts = dict(re.findall(r'^([\w-]+) = "([\w.:]+)"$', pyproject, re.M))
    assert scripts["tritonserver"] == scripts["oceanus"] == "oceanus.cli:main"


@pytest.mark.parametrize("line", LAUNCH_LINES)
def test_manifest_launch_lines_parse(line: str) -> None:
    settings, ignored = parse_args(line.split())
    assert ignored == []
    assert settings.model_repositories


def test_control_mode_is_case_insensitive() -> None:
    assert parse_args(["--model-control-mode=POLL"])[0].model_control_mode == "poll"
    assert parse_args(["--model-control-mode=Explicit"])[0].model_control_mode == "explicit"


class _TritonCommand(ServerProcess):
    """KServe's exact argument list (plus a free metrics port), through the console script's
    entry point: `tritonserver` itself exists only once the package is installed."""

    def command_line(self, repositories: Sequence[Path | str], args: Sequence[str]) -> list[str]:
        entry = "import sys; from oceanus.cli import main; sys.argv[0] = 'tritonserver'; "
        return [
            sys.executable,
            "-c",
            entry + "sys.exit(main())",
            f"--model-store={repositories[0]}",
            f"--grpc-port={self.grpc_port}",
            f"--http-port={self.http_port}",
            "--allow-grpc=true",
            "--allow-http=true",
            f"--metrics-port={self.metrics_port}",
        ]


def test_kserve_launch_line_serves_the_repository(model_repository: Path) -> None:
    server = _TritonCommand([model_repository]).wait_live()
    try:
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        b = np.ones((1, 16), dtype=np.int32)
        http = httpclient.InferenceServerClient(server.http_url)
        assert http.is_server_ready()
        inputs: list[Any] = [httpclient.InferInput("INPUT0", [1, 16], "INT32")]
        inputs.append(httpclient.InferInput("INPUT1", [1, 16], "INT32"))
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = http.infer("simple", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        ginputs: list[Any] = [grpcclient.InferInput("INPUT0", [1, 16], "INT32")]
        ginputs.append(grpcclient.InferInput("INPUT1", [1, 16], "INT32"))
        ginputs[0].set_data_from_numpy(a)
        ginputs[1].set_data_from_numpy(b)
        gresult = grpc.infer("simple", ginputs)
        np.testing.assert_array_equal(gresult.as_numpy("OUTPUT1"), a - b)
    finally:
        assert server.stop() == 0
