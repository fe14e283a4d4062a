"""Dynamic batching, queue policies, priorities and instances, observed through the public API
and `/v2/models/<m>/stats` of a real server."""

from __future__ import annotations

import asyncio
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
from tritonclient.utils import InferenceServerException

from oceanus.examples.small_models import SLOW_STEPS, build_slow

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
    stagger: float = 0.0,
) -> list[Any]:
    """Send requests concurrently; each result is an InferResult or the exception raised."""
    client = aioclient.InferenceServerClient(server.http_url)
    try:
        # One open connection per request before the clock starts: otherwise connection setup on
        # a loaded machine can eat the stagger and requests meant to queue arrive together.
        await asyncio.gather(*(client.is_server_live() for _ in requests))

        async def one(index: int, inputs: list[Any]) -> Any:
            await asyncio.sleep(stagger * index)
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
    slow = model_repository / "slow_fp32"
    # The queue-policy tests need a request to wait behind a running one; slow_fp32's ~30 ms
    # leaves too small a window on a loaded CI machine, this copy runs ~10x longer.
    slower = tmp_path_factory.mktemp("slower")
    (slower / "1").mkdir()
    onnx.save(build_slow(steps=10 * SLOW_STEPS), str(slower / "1" / "model.onnx"))
    identity = model_repository / "identity_fp32"
    add_model(
        repo,
        simple,
        "preferred4",
        8,
        SIMPLE_IO
        + """
dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 600000 }""",
    )
    add_model(
        repo,
        identity,
        "ragged",
        8,
        """
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 300000 }""",
    )
    add_model(
        repo,
        slow,
        "slow_queue1",
        64,
        SLOW_IO
        + """
dynamic_batching { default_queue_policy { max_queue_size: 1 } }""",
    )
    add_model(
        repo,
        slower,
        "slow_timeout",
        64,
        SLOW_IO
        + """
dynamic_batching { default_queue_policy { timeout_action: REJECT
  default_timeout_microseconds: 1000 allow_timeout_override: true } }""",
    )
    add_model(
        repo,
        slower,
        "slow_long_timeout",
        64,
        SLOW_IO
        + """
dynamic_batching { default_queue_policy { timeout_action: REJECT
  default_timeout_microseconds: 30000000 allow_timeout_override: true } }""",
    )
    add_model(
        repo,
        slow,
        "slow_delay",
        64,
        SLOW_IO
        + """
dynamic_batching { default_queue_policy { timeout_action: DELAY
  default_timeout_microseconds: 1000 } }""",
    )
    add_model(
        repo,
        slow,
        "slow_priority",
        1,
        SLOW_IO
        + """
dynamic_batching { priority_levels: 2 default_priority_level: 2 }""",
    )
    add_model(
        repo,
        slow,
        "slow_two",
        64,
        SLOW_IO
        + """
instance_group [ { count: 2 kind: KIND_CPU } ]""",
    )
    add_model(repo, simple, "simple_loaded", 8, SIMPLE_IO + "dynamic_batching { }")
    return repo


NO_SERVICES = ["--allow-grpc=false", "--allow-metrics=false"]


@pytest.fixture(scope="module")
def server(repository: Path, launch_module: Any) -> Any:
    return launch_module([repository], NO_SERVICES)


def test_preferred_size_dispatches_at_once(server: Any) -> None:
    started = time.monotonic()
    results = asyncio.run(gather_results(server, "preferred4", [simple_inputs() for _ in range(4)]))
    elapsed = time.monotonic() - started
    assert all(not isinstance(r, Exception) for r in results)
    assert batch_sizes(stats(server, "preferred4")) == {4: 1}
    assert elapsed < 0.5  # far less than the 0.6 s queue delay


def test_max_queue_delay_is_respected(server: Any) -> None:
    before = batch_sizes(stats(server, "preferred4"))
    started = time.monotonic()
    results = asyncio.run(gather_results(server, "preferred4", [simple_inputs() for _ in range(2)]))
    elapsed = time.monotonic() - started
    assert all(not isinstance(r, Exception) for r in results)
    after = batch_sizes(stats(server, "preferred4"))
    assert after.get(2, 0) == before.get(2, 0) + 1  # both waited for a fuller batch, together
    assert 0.55 <= elapsed < 5.0


def test_rows_count_toward_the_batch(server: Any) -> None:
    before = stats(server, "preferred4")
    results = asyncio.run(
        gather_results(
            server, "preferred4", [simple_inputs(rows=3, value=2), simple_inputs(rows=1, value=5)]
        )
    )
    assert results[0].as_numpy("OUTPUT0").tolist() == [[4] * 16] * 3
    assert results[1].as_numpy("OUTPUT0").tolist() == [[10] * 16]
    after = stats(server, "preferred4")
    assert after["inference_count"] - before["inference_count"] == 4
    assert after["execution_count"] - before["execution_count"] == 1


def test_different_shapes_are_never_merged(server: Any) -> None:
    results = asyncio.run(
        gather_results(server, "ragged", [slow_inputs(1.0, width=3), slow_inputs(2.0, width=5)])
    )
    assert results[0].as_numpy("OUTPUT0").shape == (1, 3)
    assert results[1].as_numpy("OUTPUT0").shape == (1, 5)
    assert batch_sizes(stats(server, "ragged")) == {1: 2}


def test_queue_full_is_rejected_with_503(server: Any) -> None:
    results = asyncio.run(gather_results(server, "slow_queue1", [slow_inputs() for _ in range(6)]))
    errors = [r for r in results if isinstance(r, Exception)]
    assert errors, "with one queue slot and one busy instance, some requests must be rejected"
    assert len(errors) <= 4
    for error in errors:
        assert error.status() == "503"
        assert error.message() == "[request id: <id_unknown>] Exceeds maximum queue size"


def test_queue_timeout_rejects_with_503(server: Any) -> None:
    results = asyncio.run(
        gather_results(server, "slow_timeout", [slow_inputs() for _ in range(4)], stagger=0.05)
    )
    assert not isinstance(results[0], Exception)
    errors = [r for r in results if isinstance(r, Exception)]
    assert errors
    for error in errors:
        assert error.status() == "503"
        assert error.message() == "Request timeout expired"
    assert stats(server, "slow_timeout")["inference_stats"]["fail"]["count"] == len(errors)


def test_timeout_override_can_only_shorten_the_timeout(server: Any) -> None:
    """The request `timeout` shortens the 30 s default of slow_long_timeout, as in Triton."""
    results = asyncio.run(
        gather_results(
            server,
            "slow_long_timeout",
            [slow_inputs(), slow_inputs(), slow_inputs()],
            options=[{}, {"timeout": 1000}, {"timeout": 60_000_000}],
            stagger=0.05,
        )
    )
    assert not isinstance(results[0], Exception)
    assert isinstance(results[1], InferenceServerException)
    assert results[1].message() == "Request timeout expired"
    assert not isinstance(results[2], Exception)


def test_delay_action_still_serves_expired_requests(server: Any) -> None:
    results = asyncio.run(
        gather_results(server, "slow_delay", [slow_inputs() for _ in range(4)], stagger=0.01)
    )
    assert all(not isinstance(r, Exception) for r in results)


def test_priority_levels_serve_high_priority_first(repository: Path, launch: Any) -> None:
    """TRITONSERVER_DELAY_SCHEDULER=4 holds the first batch until all four are queued, so the
    order of execution (one instance, batches of one) is decided by priority alone."""
    server = launch([repository], [*NO_SERVICES], env={"TRITONSERVER_DELAY_SCHEDULER": "4"})
    order: list[str] = []

    async def run() -> None:
        client = aioclient.InferenceServerClient(server.http_url)
        try:

            async def one(label: str, priority: int, delay: float) -> None:
                await asyncio.sleep(delay)
                await client.infer("slow_priority", slow_inputs(), priority=priority)
                order.append(label)

            await asyncio.gather(
                one("low-a", 0, 0.0),
                one("low-b", 0, 0.05),
                one("high-a", 1, 0.1),
                one("high-b", 1, 0.15),
            )
        finally:
            await client.close()

    asyncio.run(run())
    assert set(order[:2]) == {"high-a", "high-b"}
    assert set(order[2:]) == {"low-a", "low-b"}


def test_two_instances_execute_at_the_same_time(server: Any) -> None:
    asyncio.run(gather_results(server, "slow_two", [slow_inputs()]))  # warm up
    before = stats(server, "slow_two")
    started = time.monotonic()
    results = asyncio.run(gather_results(server, "slow_two", [slow_inputs(), slow_inputs(2.0)]))
    wall = time.monotonic() - started
    assert all(not isinstance(r, Exception) for r in results)
    after = stats(server, "slow_two")
    assert after["execution_count"] - before["execution_count"] == 2
    infer_ns = (
        after["inference_stats"]["compute_infer"]["ns"]
        - before["inference_stats"]["compute_infer"]["ns"]
    )
    # two executions that overlap take less wall time than their summed compute time
    assert wall * 1e9 < 0.9 * infer_ns


def test_concurrent_single_requests_are_batched(server: Any) -> None:
    results = asyncio.run(
        gather_results(server, "simple_loaded", [simple_inputs(value=i) for i in range(64)])
    )
    for i, result in enumerate(results):
        assert result.as_numpy("OUTPUT0").tolist() == [[2 * i] * 16]
    entry = stats(server, "simple_loaded")
    assert entry["inference_count"] == 64
    assert entry["execution_count"] < 64


def test_disconnected_clients_leave_the_queue(model_repository: Path, launch: Any) -> None:
    """With Triton's TRITONSERVER_DELAY_SCHEDULER=2 nothing runs until two requests are queued:
    a client that leaves first must not count toward those two, nor be executed."""
    import orjson

    server = launch(
        [model_repository],
        ["--allow-grpc=false", "--allow-metrics=false"],
        env={"TRITONSERVER_DELAY_SCHEDULER": "2"},
    )
    body = orjson.dumps(
        {
            "inputs": [
                {"name": name, "datatype": "INT32", "shape": [1, 16], "data": [1] * 16}
                for name in ("INPUT0", "INPUT1")
            ]
        }
    )
    request = (
        b"POST /v2/models/simple_dyna/infer HTTP/1.1\r\nHost: x\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", server.http_port)) as sock:
            sock.sendall(request)
            time.sleep(0.05)
        time.sleep(0.2)  # let the server see the disconnect before the next arrival
    results = asyncio.run(gather_results(server, "simple_dyna", [simple_inputs(value=3)] * 2))
    assert [r.as_numpy("OUTPUT0")[0, 0] for r in results] == [6, 6]
    entry = stats(server, "simple_dyna")
    assert entry["execution_count"] == 1
    assert entry["inference_count"] == 2
    assert entry["inference_stats"]["success"]["count"] == 2
