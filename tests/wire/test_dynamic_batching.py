"""Dynamic batching on a real server, for what only the wire shows: queue refusals reach an HTTP
client as 503 with Triton's words, concurrent HTTP requests form batches, and a client that
disconnects leaves the queue. The batcher's rules themselves (preferred sizes, delays, priorities,
queue policies, cancellation) are tested in process: tests/core/test_dynamic_batching_rules.py."""

from __future__ import annotations

import asyncio
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
from tritonclient.utils import InferenceServerException

SIMPLE_IO = """
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
"""
SLOW_IO = """
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""


def add_model(repository: Path, source: Path, name: str, max_batch: int, body: str) -> None:
    """A copy of a generated model under a new name with its own config."""
    target = repository / name
    (target / "1").mkdir(parents=True)
    shutil.copy(source / "1" / "model.onnx", target / "1" / "model.onnx")
    (target / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {max_batch}\n{body}\n'
    )


def simple_inputs(rows: int = 1, value: int = 1) -> list[aioclient.InferInput]:
    data = np.full((rows, 16), value, dtype=np.int32)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = aioclient.InferInput(name, [rows, 16], "INT32")
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    return inputs


def slow_inputs(value: float = 1.0, width: int = 16) -> list[aioclient.InferInput]:
    tensor = aioclient.InferInput("INPUT0", [1, width], "FP32")
    tensor.set_data_from_numpy(np.full((1, width), value, dtype=np.float32))
    return [tensor]


def stats(server: Any, model: str) -> dict[str, Any]:
    client = httpclient.InferenceServerClient(server.http_url)
    return client.get_inference_statistics(model)["model_stats"][0]  # type: ignore[no-any-return]


def batch_sizes(entry: dict[str, Any]) -> dict[int, int]:
    return {b["batch_size"]: b["compute_infer"]["count"] for b in entry["batch_stats"]}


async def gather_results(
    server: Any,
    model: str,
    requests: list[list[Any]],
    options: list[dict[str, Any]] | None = None,
) -> list[Any]:
    """Send requests concurrently; each result is an InferResult or the exception raised."""
    client = aioclient.InferenceServerClient(server.http_url)
    try:
        # One open connection per request first, so that the requests leave together.
        await asyncio.gather(*(client.is_server_live() for _ in requests))

        async def one(index: int, inputs: list[Any]) -> Any:
            kwargs = options[index] if options else {}
            try:
                return await client.infer(model, inputs, **kwargs)
            except InferenceServerException as exc:
                return exc

        return list(await asyncio.gather(*(one(i, r) for i, r in enumerate(requests))))
    finally:
        await client.close()


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, model_repository: Path) -> Path:
    repo = tmp_path_factory.mktemp("batching")
    simple = model_repository / "simple"
    slow = model_repository / "slow_fp32"  # ~30 ms a request
    # One request per batch: while the first runs, the others wait in the queue.
    add_model(
        repo,
        slow,
        "slow_queue2",
        1,
        SLOW_IO + "dynamic_batching { default_queue_policy { max_queue_size: 2 } }",
    )
    add_model(
        repo,
        slow,
        "slow_timeout",
        1,
        SLOW_IO
        + """
dynamic_batching { default_queue_policy { timeout_action: REJECT
  default_timeout_microseconds: 1000 } }""",
    )
    add_model(repo, simple, "simple_loaded", 8, SIMPLE_IO + "dynamic_batching { }")
    add_model(repo, simple, "simple_leaving", 8, SIMPLE_IO + "dynamic_batching { }")
    return repo


NO_SERVICES = ["--allow-grpc=false", "--allow-metrics=false"]


@pytest.fixture(scope="module")
def server(repository: Path, launch_module: Any) -> Any:
    """Triton's TRITONSERVER_DELAY_SCHEDULER=2 holds each model's first batch until two
    requests are queued (what the disconnect test needs; harmless for the others)."""
    return launch_module([repository], NO_SERVICES, env={"TRITONSERVER_DELAY_SCHEDULER": "2"})


def test_queue_refusals_reach_the_client_as_503(server: Any) -> None:
    """One request runs, two may wait, the others find the queue full; with a 1 ms queue
    timeout a request that waits behind the running one expires. (How many of each depends on
    how the machine interleaves the requests, so the counts follow what happened.)"""
    results = asyncio.run(gather_results(server, "slow_queue2", [slow_inputs() for _ in range(6)]))
    errors = [r for r in results if isinstance(r, Exception)]
    assert 1 <= len(errors) <= 3, results
    for error in errors:
        assert error.status() == "503"
        assert error.message() == "[request id: <id_unknown>] Exceeds maximum queue size"

    results = asyncio.run(gather_results(server, "slow_timeout", [slow_inputs() for _ in range(3)]))
    errors = [r for r in results if isinstance(r, Exception)]
    assert errors, results
    for error in errors:
        assert error.status() == "503"
        assert error.message() == "Request timeout expired"
    assert stats(server, "slow_timeout")["inference_stats"]["fail"]["count"] == len(errors)


def test_concurrent_single_requests_are_batched(server: Any) -> None:
    results = asyncio.run(
        gather_results(server, "simple_loaded", [simple_inputs(value=i) for i in range(64)])
    )
    for i, result in enumerate(results):
        assert result.as_numpy("OUTPUT0").tolist() == [[2 * i] * 16]
    entry = stats(server, "simple_loaded")
    assert entry["inference_count"] == 64
    assert entry["execution_count"] < 64


def test_disconnected_clients_leave_the_queue(server: Any) -> None:
    """Nothing runs until two requests are queued (TRITONSERVER_DELAY_SCHEDULER=2): a client
    that leaves first must not count toward those two, nor be executed."""
    import orjson

    body = orjson.dumps(
        {
            "inputs": [
                {"name": name, "datatype": "INT32", "shape": [1, 16], "data": [1] * 16}
                for name in ("INPUT0", "INPUT1")
            ]
        }
    )
    request = (
        b"POST /v2/models/simple_leaving/infer HTTP/1.1\r\nHost: x\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", server.http_port)) as sock:
            sock.sendall(request)
            time.sleep(0.05)  # the server reads the request before the client leaves
        # Nothing the server does on a disconnect is visible from outside (the request is
        # dropped when the next batch forms): give it time to see this one.
        time.sleep(0.2)
    results = asyncio.run(gather_results(server, "simple_leaving", [simple_inputs(value=3)] * 2))
    assert [r.as_numpy("OUTPUT0")[0, 0] for r in results] == [6, 6]
    entry = stats(server, "simple_leaving")
    assert entry["execution_count"] == 1
    assert entry["inference_count"] == 2
    assert entry["inference_stats"]["success"]["count"] == 2
