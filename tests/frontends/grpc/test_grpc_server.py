"""The gRPC server's options: Triton's --grpc-* flags, TLS, port conflicts, clean shutdown."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from oceanus.examples import example_repository


def infer_simple(client: grpcclient.InferenceServerClient) -> np.ndarray:
    tensors = []
    for name in ("INPUT0", "INPUT1"):
        tensor = grpcclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(np.full((1, 16), 5, np.int32))
        tensors.append(tensor)
    return client.infer("simple", tensors).as_numpy("OUTPUT0")


def test_triton_grpc_flags_and_clean_shutdown(launch: Any) -> None:
    server = launch(
        [example_repository(["simple"])],
        [
            "--allow-metrics=false",
            "--grpc-keepalive-time=10000",
            "--grpc-keepalive-timeout=5000",
            "--grpc-keepalive-permit-without-calls=true",
            "--grpc-http2-max-pings-without-data=0",
            "--grpc-http2-min-recv-ping-interval-without-data=5000",
            "--grpc-http2-max-ping-strikes=0",
            "--grpc-max-connection-age=600000",
            "--grpc-max-connection-age-grace=10000",
            "--grpc-infer-allocation-pool-size=16",
        ],
    )
    client = grpcclient.InferenceServerClient(
        server.grpc_url,
        keepalive_options=grpcclient.KeepAliveOptions(
            keepalive_time_ms=10000, keepalive_permit_without_calls=True
        ),
    )
    try:
        assert (infer_simple(client) == 10).all()
    finally:
        client.close()
    assert server.stop() == 0
    log = server.log()
    assert f"Started GRPCInferenceService at 127.0.0.1:{server.grpc_port}" in log
    assert "--grpc-infer-allocation-pool-size is accepted for compatibility" in log
    assert "--grpc-keepalive" not in log


def test_port_in_use_fails_to_start(server: Any) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "oceanus",
            f"--model-repository={example_repository(['simple'])}",
            "--http-port=0",
            "--allow-metrics=false",
            "--grpc-address=127.0.0.1",
            f"--grpc-port={server.grpc_port}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    # checked before any model loads, in one line naming the flag (tests/test_startup.py)
    assert f"--grpc-port {server.grpc_port} is already in use on 127.0.0.1" in result.stderr


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls(tmp_path: Path, launch: Any) -> None:
    key, cert = tmp_path / "server.key", tmp_path / "server.crt"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    server = launch(
        [example_repository(["simple"])],
        [
            "--allow-metrics=false",
            "--grpc-use-ssl=true",
            f"--grpc-server-cert={cert}",
            f"--grpc-server-key={key}",
        ],
    )
    client = grpcclient.InferenceServerClient(
        server.grpc_url, ssl=True, root_certificates=str(cert)
    )
    try:
        assert client.is_server_live()
        assert (infer_simple(client) == 10).all()
    finally:
        client.close()
