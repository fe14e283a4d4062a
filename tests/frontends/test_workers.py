"""Frontend worker processes (`--frontend-workers`): what only exists with several processes.

Every other end-to-end test already runs with workers (scripts/test.sh runs the suite with
`--frontend-workers 2`, then tests/frontends with 0). Here: the worker/core message codec, batches
forming across requests that came through different workers, a worker dying and being replaced
while the other's clients see nothing, the core dying taking the workers with it, and draining.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from oceanus.core.shared_memory import Region
from oceanus.core.types import InferRequest, InferResponse, RequestedOutput, Tensor
from oceanus.cpus import usable_cpus
from oceanus.frontends.workers import messages as m
from oceanus.frontends.workers.supervisor import claim_port

# ---- the message codec (in-process) ----------------------------------------------------------


@pytest.mark.parametrize(
    ("datatype", "array"),
    [
        ("INT32", np.arange(6, dtype=np.int32).reshape(2, 3)),
        ("FP16", np.linspace(0, 1, 4, dtype=np.float16)),
        ("BOOL", np.array([True, False, True])),
        ("UINT64", np.array([2**64 - 1, 0], dtype=np.uint64)),
        ("BYTES", np.array([b"a", b"", b"\x00\xff"], dtype=object)),
    ],
)
def test_a_request_and_its_response_cross_unchanged(datatype: str, array: np.ndarray) -> None:
    request = InferRequest(
        "model",
        "3",
        "id-1",
        inputs=[Tensor("IN", datatype, array.shape, array, {"p": 1})],
        outputs=[RequestedOutput("OUT", {"binary_data": True})],
        parameters={"priority": 2, "key": "value"},
    )
    fields = m.encode_request(request)
    decoded = m.decode_request(fields)
    assert (decoded.model_name, decoded.model_version, decoded.id) == ("model", "3", "id-1")
    assert decoded.parameters == {"priority": 2, "key": "value"}
    assert decoded.received_ns == request.received_ns
    tensor = decoded.inputs[0]
    assert (tensor.name, tensor.datatype, tensor.shape, tensor.parameters) == (
        "IN",
        datatype,
        array.shape,
        {"p": 1},
    )
    assert tensor.data.tolist() == array.reshape(-1).tolist()
    assert decoded.outputs == [RequestedOutput("OUT", {"binary_data": True})]

    response = InferResponse("model", "3", "id-1", [Tensor("OUT", datatype, array.shape, array)])
    fields, block = m.encode_response(response)
    assert block is None  # no ring: every payload inline
    back = m.decode_response(fields, request)
    assert back.outputs[0].data.shape == array.shape
    assert back.outputs[0].data.tolist() == array.tolist()
    assert back.requested == {"OUT": request.outputs[0]}  # type: ignore[index]


def test_response_outputs_cross_in_c_order_whatever_their_layout_or_dtype() -> None:
    """encode_response's short path (one tobytes for a small output of its datatype's dtype)
    must give the bytes the general one gives: C order for a transposed or strided view, and
    an output in another dtype than its datatype's (a Python model's) keeps that dtype."""
    base = np.arange(12, dtype=np.int32).reshape(3, 4)
    outputs = [
        Tensor("T", "INT32", (4, 3), base.T),  # Fortran-ordered view
        Tensor("S", "INT32", (3, 2), base[:, ::2]),  # strided view
        Tensor("D", "FP32", (2,), np.array([1.5, 2.5], dtype=np.float64)),  # another dtype
    ]
    request = InferRequest("model")
    fields, block = m.encode_response(InferResponse("model", "1", "", outputs))
    assert block is None
    payloads = {name: (payload, dtype) for name, _, _, payload, dtype in fields[3]}
    assert payloads["T"] == (np.ascontiguousarray(base.T).tobytes(), "")
    assert payloads["S"] == (np.ascontiguousarray(base[:, ::2]).tobytes(), "")
    assert payloads["D"][1] == np.dtype(np.float64).str
    back = {t.name: t.data for t in m.decode_response(fields, request).outputs}
    assert back["T"].tolist() == base.T.tolist()
    assert back["S"].tolist() == base[:, ::2].tolist()
    assert back["D"].dtype == np.float64 and back["D"].tolist() == [1.5, 2.5]


def test_requests_only_the_core_can_carry_are_refused_by_the_codec() -> None:
    plain = np.zeros(2, dtype=np.int32)
    with pytest.raises(m.NeedsCore):  # a datatype the core's validation would have to convert
        m.encode_request(
            InferRequest("m", inputs=[Tensor("X", "INT32", (2,), plain.astype(np.int64))])
        )
    with pytest.raises(m.NeedsCore):  # str elements: the core must see them as str
        text = np.array(["a"], dtype=object)
        m.encode_request(InferRequest("m", inputs=[Tensor("X", "BYTES", (1,), text)]))
    with pytest.raises(m.NeedsCore):  # shared memory regions live in the core
        uses = InferRequest("m", inputs=[Tensor("X", "INT32", (2,), plain)])
        uses.shm_regions = [object()]  # type: ignore[list-item]
        m.encode_request(uses)
    from oceanus.frontends.workers.handlers import CORE_REGIONS

    with pytest.raises(m.NeedsCore):
        CORE_REGIONS.input_view("region", 0, 8, list[Region]())


@pytest.mark.parametrize("rings", [False, True], ids=["socket", "rings"])
def test_the_channel_carries_many_and_big_messages_in_order(rings: bool, tmp_path: Path) -> None:
    """Two AioChannels over a real socketpair, with or without message rings: small messages
    batched per wake-up (with rings: in shared memory, a doorbell only for a sleeping reader)
    and frames bigger than a socket buffer (and than the ring) arrive whole, typed, in order."""
    import asyncio
    import socket

    from oceanus.ipc import msgring
    from oceanus.ipc.aio import AioChannel

    pair: list[Any] = [None, None]
    if rings:
        for name in ("lr", "rl"):
            msgring.create(str(tmp_path / name), 64 << 10)  # small: fills, wraps, overflows
        pair = [
            (
                msgring.MsgRingWriter(str(tmp_path / "lr")),
                msgring.MsgRingReader(str(tmp_path / "rl")),
            ),
            (
                msgring.MsgRingWriter(str(tmp_path / "rl")),
                msgring.MsgRingReader(str(tmp_path / "lr")),
            ),
        ]

    async def run() -> tuple[list[Any], int]:
        left_sock, right_sock = socket.socketpair()
        received: list[Any] = []
        done = asyncio.Event()

        def on_message(message: Any) -> None:
            received.append(message)
            if len(received) == 5003:
                done.set()

        left = await AioChannel.open(left_sock, m.KINDS, lambda _: None, lambda: None, pair[0])
        right = await AioChannel.open(right_sock, m.KINDS, on_message, lambda: None, pair[1])
        for index in range(5000):
            left.send(m.Cancel(index))
            if index % 1000 == 0:
                await asyncio.sleep(0)  # let the reader catch up now and then
        for size in (3 << 20, 5, 700_001):
            left.send(m.StreamIn(size, b"x" * size))
        await asyncio.wait_for(done.wait(), 30)
        left.close()
        right.close()
        return received, left.doorbells

    received, doorbells = asyncio.run(run())
    assert received[:5000] == [m.Cancel(index) for index in range(5000)]
    assert all(type(message) is m.Cancel for message in received[:5000])
    assert [(message.id, len(message.data)) for message in received[5000:]] == [
        (3 << 20, 3 << 20),
        (5, 5),
        (700_001, 700_001),
    ]
    if rings:
        assert doorbells < 100  # only when the reader slept: never one per message


def test_the_threaded_and_the_asyncio_face_speak_one_link() -> None:
    """oceanus/ipc's threaded Channel (the Python backend's) and its asyncio face frame alike."""
    import asyncio
    import socket

    from oceanus.ipc.aio import AioChannel
    from oceanus.ipc.channel import Channel

    threaded_sock, aio_sock = socket.socketpair()
    threaded = Channel(threaded_sock, m.KINDS)

    async def run() -> Any:
        answered: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        aio = await AioChannel.open(aio_sock, m.KINDS, answered.set_result, lambda: None)
        aio.send(m.GrpcError(7, 3, "details"))
        got = await asyncio.to_thread(threaded.recv, 10)
        assert type(got) is m.GrpcError
        threaded.send(got._replace(details="back"))
        message = await asyncio.wait_for(answered, 10)
        aio.close()
        return message

    assert asyncio.run(run()) == m.GrpcError(7, 3, "back")
    threaded.close()


def test_big_tensors_cross_through_the_ring_and_small_ones_inline(tmp_path: Path) -> None:
    """Tensor bytes of at least RING_BYTES go through the sender's shared-memory ring (the
    message carries their place), smaller ones inline; both arrive unchanged, and the block is
    released for reuse."""
    from oceanus.ipc.rings import RingReader, RingWriter, create_ring_file

    path = str(tmp_path / "ring")
    create_ring_file(path, 1 << 20)
    writer = RingWriter(path, 1 << 20, str(tmp_path / "spill-"))
    reader = RingReader(path, 1 << 20)
    big = np.arange(m.RING_BYTES, dtype=np.float32)  # 4x RING_BYTES bytes
    small = np.arange(4, dtype=np.int32)
    request = InferRequest(
        "model",
        "",
        "",
        inputs=[Tensor("BIG", "FP32", big.shape, big), Tensor("SMALL", "INT32", (4,), small)],
    )
    for _ in range(3):  # more than the ring holds at once: only released blocks make room
        fields, loc = m.place_request(m.encode_request(request), writer)
        assert loc is not None and loc[0] == "r"
        assert isinstance(fields[3][0][3], tuple) and isinstance(fields[3][1][3], bytes)
        block = m.Block(reader, loc)
        decoded = m.decode_request(fields, block)
        block.close()
        assert np.array_equal(decoded.inputs[0].data, big)
        assert np.array_equal(decoded.inputs[1].data, small)
    writer.close()
    reader.close()


def test_a_port_in_use_cannot_be_claimed(server: Any) -> None:
    with pytest.raises(OSError):
        claim_port("127.0.0.1", server.http_port)
    assert claim_port("127.0.0.1", 0) > 0


# ---- several processes ----------------------------------------------------------------------


def _worker_pids(core_pid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if parent == core_pid and b"oceanus.frontend_worker" in command:
            pids.append(int(entry.name))
    return sorted(pids)


def _wait_for(condition: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def _simple_body(value: int) -> bytes:
    data = [value] * 16
    return json.dumps(
        {
            "id": f"r{value}",
            "inputs": [
                {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": data},
                {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": data},
            ],
        }
    ).encode()


def _post(port: int, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("POST", path, body)
    response = connection.getresponse()
    return response.status, json.loads(response.read() or b"{}")


def test_batches_form_across_requests_from_different_workers(
    model_repository: Path, launch: Any
) -> None:
    """Eight requests on eight connections, held until all eight are queued
    (TRITONSERVER_DELAY_SCHEDULER): one batch of eight, whichever worker each arrived by. The
    verbose log names the process (its pid) that decoded each request."""
    server = launch(
        [model_repository],
        ["--frontend-workers=2", "--log-verbose=1"],
        env={"TRITONSERVER_DELAY_SCHEDULER": "8"},
    )
    workers = set(_worker_pids(server.process.pid))
    assert len(workers) == 2
    results: list[tuple[int, dict[str, Any]]] = []

    def send(value: int) -> None:
        results.append(_post(server.http_port, "/v2/models/simple_dyna/infer", _simple_body(value)))

    threads = [threading.Thread(target=send, args=(v,)) for v in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(r[1]["outputs"][0]["data"][0] for r in results) == [2 * v for v in range(8)]
    stats = httpclient.InferenceServerClient(server.http_url).get_inference_statistics(
        "simple_dyna"
    )["model_stats"][0]
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}
    assert sizes == {8: 1}
    decoded_by = {
        int(pid)
        for pid in re.findall(
            r"^I\S+ \S+ (\d+) infer.py:\d+\] HTTP infer request 'r\d' for 'simple_dyna'",
            server.log(),
            re.M,
        )
    }
    assert decoded_by <= workers and decoded_by  # decoded in the workers, not in the core


def _shm_left(core_pid: int) -> list[str]:
    """What the link of the server `core_pid` has in /dev/shm: its rings are unlinked as soon as
    both processes mapped them, so nothing, whenever a test looks."""
    from oceanus.ipc.budget import shm_dir

    return sorted(p.name for p in Path(shm_dir()).glob(f"oceanus-fw-{core_pid}-*"))


def test_a_dead_worker_is_replaced_and_the_others_clients_see_nothing(
    model_repository: Path, launch: Any
) -> None:
    """Keep-alive connections served by one worker go on without an error while the other
    worker is killed and replaced (the verbose log tells which worker decoded which request)."""
    server = launch([model_repository], ["--frontend-workers=2", "--log-verbose=1"])
    before = _worker_pids(server.process.pid)
    assert len(before) == 2
    connections = [http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)]
    connections += [
        http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30) for _ in range(5)
    ]

    def infer(connection: http.client.HTTPConnection, value: int) -> int:
        connection.request("POST", "/v2/models/simple/infer", _simple_body(value))
        response = connection.getresponse()
        assert json.loads(response.read())["outputs"][0]["data"][0] == 2 * value
        return response.status

    for index, connection in enumerate(connections):
        assert infer(connection, index) == 200
    served_by = {
        int(value): int(pid)
        for pid, value in re.findall(
            r"^I\S+ \S+ (\d+) infer.py:\d+\] HTTP infer request 'r(\d)'", server.log(), re.M
        )
    }
    survivor = served_by[0]
    victim = next(pid for pid in before if pid != survivor)
    mine = [connections[i] for i, pid in served_by.items() if pid == survivor]
    os.kill(victim, signal.SIGKILL)
    for round_index in range(20):  # while the victim dies and its replacement starts
        for connection in mine:
            assert infer(connection, round_index % 8) == 200
    after = _wait_for(
        lambda: (
            (pids := _worker_pids(server.process.pid))
            and len(pids) == 2
            and victim not in pids
            and pids
        )
    )
    assert survivor in after
    assert "exited with status -9; starting a new one" in server.log()
    fresh = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    assert infer(fresh, 3) == 200
    # The new worker unlinks its rings once it has mapped them, before it says hello.
    _wait_for(lambda: _shm_left(server.process.pid) == [])


def test_the_workers_stop_when_the_core_dies(model_repository: Path, launch: Any) -> None:
    """No half-alive server: without its core process a worker stops listening and exits."""
    server = launch([model_repository], ["--frontend-workers=2"])
    workers = _worker_pids(server.process.pid)
    os.kill(server.process.pid, signal.SIGKILL)
    server.process.wait()

    def all_gone() -> bool:
        return not any(Path(f"/proc/{pid}").exists() for pid in workers)

    _wait_for(all_gone, timeout=10)
    assert _shm_left(server.process.pid) == []
    assert server.log().count("the core process has gone; exiting") == len(workers)
    with pytest.raises(OSError):
        http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=2).request(
            "GET", "/v2/health/live"
        )


def _arrived(server: Any, model: str) -> float:
    """Requests the core has taken for `model`: pending (queued or executing) plus answered."""
    connection = http.client.HTTPConnection("127.0.0.1", server.metrics_port, timeout=5)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    total = 0.0
    for family in ("nv_inference_pending_request_count", "nv_inference_request_success"):
        found = re.search(rf'^{family}{{model="{model}",version="1"}} (\S+)$', text, re.M)
        total += float(found.group(1)) if found else 0.0
    return total


def test_sigterm_drains_the_workers(model_repository: Path, launch: Any) -> None:
    """Requests in flight when SIGTERM comes are answered; the server then exits 0."""
    server = launch([model_repository], ["--frontend-workers=2"])
    answers: list[int] = []
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]}
    ).encode()

    def slow() -> None:
        answers.append(_post(server.http_port, "/v2/models/slow_fp32/infer", body)[0])

    threads = [threading.Thread(target=slow) for _ in range(4)]
    for thread in threads:
        thread.start()
    # slow_fp32 runs one ~30 ms request at a time: SIGTERM once all four reached the core.
    _wait_for(lambda: _arrived(server, "slow_fp32") >= 4, timeout=10)
    server.process.send_signal(signal.SIGTERM)
    for thread in threads:
        thread.join()
    assert answers == [200] * 4
    assert server.process.wait(30) == 0
    assert _shm_left(server.process.pid) == []


def test_a_bad_worker_count_is_refused() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "oceanus", "--frontend-workers=x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--frontend-workers" in result.stderr


AUTO_ON_CPUS = """
import os, sys
os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: int(sys.argv[1])]))
from oceanus.frontends.workers.supervisor import auto_workers
print(auto_workers())
"""


@pytest.mark.parametrize("cpus", [1, 2, 3, 4])
def test_auto_runs_one_worker_per_cpu_and_none_below_three(cpus: int) -> None:
    if usable_cpus() < cpus:
        pytest.skip(f"needs {cpus} usable CPUs")
    result = subprocess.run(
        [sys.executable, "-c", AUTO_ON_CPUS, str(cpus)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert int(result.stdout) == (cpus if cpus >= 3 else 0)
