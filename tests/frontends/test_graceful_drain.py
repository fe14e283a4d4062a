"""Graceful drain on SIGTERM, as a rolling update needs it: under steady HTTP load the server
turns not-ready, stops accepting connections, answers every request that reached it (a request
arriving on an open keep-alive connection during the drain gets a whole 503 with
`Connection: close`, never a reset), finishes an open gRPC stream, and exits 0."""

from __future__ import annotations

import http.client
import queue
import shutil
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient

SLOW_BODY = orjson.dumps(
    {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]}
)
# A request to `held` waits in its batcher's queue for 2 s: it keeps the drain open long enough to
# send requests during it, whatever the machine's speed.
HELD_CONFIG = """name: "held"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 2000000 }
"""
LOAD_THREADS = 8


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, model_repository: Path) -> Path:
    repo = tmp_path_factory.mktemp("drain")
    shutil.copytree(model_repository / "slow_fp32", repo / "slow_fp32")
    (repo / "held" / "1").mkdir(parents=True)
    shutil.copy(model_repository / "identity_fp32" / "1" / "model.onnx", repo / "held" / "1")
    (repo / "held" / "config.pbtxt").write_text(HELD_CONFIG)
    return repo


@dataclass
class LoadTally:
    ok: int = 0
    refused_503: int = 0
    # A request written on an established connection that got no whole answer: the failure
    # this feature exists to prevent.
    lost: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def steady_load(port: int, tally: LoadTally, stop: threading.Event) -> None:
    """Back-to-back inference on a keep-alive connection; reconnects after `Connection: close`
    and stops once connections are refused (the server stopped listening)."""
    connection: http.client.HTTPConnection | None = None
    while not stop.is_set():
        if connection is None:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            try:
                connection.connect()
            except ConnectionRefusedError:
                return  # never reached the server: a client retries elsewhere
        try:
            connection.request("POST", "/v2/models/slow_fp32/infer", body=SLOW_BODY)
            response = connection.getresponse()
            response.read()
        except (OSError, http.client.HTTPException) as exc:
            with tally.lock:
                tally.lost.append(repr(exc))
            connection.close()
            connection = None
            continue
        with tally.lock:
            if response.status == 200:
                tally.ok += 1
            elif response.status == 503:
                tally.refused_503 += 1
            else:
                tally.lost.append(f"unexpected status {response.status}")
        if response.will_close:
            connection.close()
            connection = None


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_sigterm_under_load_answers_everything_and_exits_0(repository: Path, launch: Any) -> None:
    server = launch([repository], ["--exit-timeout-secs=30"])
    # Kept-alive connections that are idle when the drain starts and then send a request.
    idle = [http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30) for _ in "ab"]
    for connection in idle:
        connection.request("GET", "/v2/health/live")
        assert connection.getresponse().read() == b""

    tally = LoadTally()
    stop = threading.Event()
    threads = [
        threading.Thread(target=steady_load, args=(server.http_port, tally, stop), daemon=True)
        for _ in range(LOAD_THREADS)
    ]
    for thread in threads:
        thread.start()

    # An open gRPC stream with a request in flight (held in its queue) when SIGTERM comes.
    streamed: queue.Queue[Any] = queue.Queue()
    stream_client = grpcclient.InferenceServerClient(server.grpc_url)
    stream_client.start_stream(callback=lambda result, error: streamed.put(error or result))
    held_input = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    held_input.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))

    deadline = time.monotonic() + 60
    while tally.ok < 30 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert tally.ok >= 30, f"load did not get going: {tally}"
    stream_client.async_stream_infer("held", [held_input])
    time.sleep(0.2)  # the held request reaches its queue
    server.process.send_signal(signal.SIGTERM)

    deadline = time.monotonic() + 10
    while listening(server.http_port) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert not listening(server.http_port), "still accepting connections after SIGTERM"
    assert server.process.poll() is None, "the drain ended before the held request finished"

    idle[0].request("GET", "/v2/health/ready")
    ready = idle[0].getresponse()
    assert ready.status != 200
    assert ready.getheader("connection") == "close"
    ready.read()
    idle[1].request("POST", "/v2/models/slow_fp32/infer", body=SLOW_BODY)
    refused = idle[1].getresponse()
    assert refused.status == 503
    assert refused.getheader("connection") == "close"
    assert b"Server is shutting down" in refused.read()

    assert server.process.wait(60) == 0, server.log()
    stop.set()
    for thread in threads:
        thread.join(30)
    result = streamed.get(timeout=10)
    stream_client.stop_stream()
    assert not isinstance(result, Exception), result
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.arange(4).reshape(1, 4))
    assert tally.lost == [], tally
    assert tally.ok >= 30
