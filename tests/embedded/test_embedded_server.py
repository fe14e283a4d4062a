"""`oceanus.Server`: the command line's options, numpy and DLPack tensors without copies,
decoupled responses, asyncio, requests from several threads batched together, and the
loop lent to callers (docs/embedded.md)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import oceanus
from oceanus.embedded import InvalidArgumentError, Tensor
from oceanus.examples import example_repository


@pytest.fixture(scope="module")
def server(embedded_repository: Path) -> Iterator[oceanus.Server]:
    with oceanus.Server(model_repository=embedded_repository, log_info=False) as started:
        yield started


def _pair(value: int = 1) -> dict[str, np.ndarray]:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    return {"INPUT0": a, "INPUT1": np.full((1, 16), value, np.int32)}


def test_options_are_the_command_line_flags(embedded_repository: Path) -> None:
    server = oceanus.Server(
        model_repository=[embedded_repository],
        model_control_mode="explicit",
        load_model=["simple"],
        strict_readiness=False,
        rate_limit="execution_count",
        cache_config="local,size=1048576",
    )
    settings = server.settings
    assert settings.load_models == ["simple"] and settings.model_control_mode == "explicit"
    assert settings.response_cache_size == 1048576 and settings.rate_limit == "execution_count"
    assert not settings.strict_readiness
    same = oceanus.Server.from_command_line(
        [f"--model-repository={embedded_repository}", "--model-control-mode=explicit"]
    )
    assert same.settings.model_repositories == [str(embedded_repository)]
    with pytest.raises(InvalidArgumentError, match="unknown server option 'model_repo'"):
        oceanus.Server(model_repo="x")
    with pytest.raises(InvalidArgumentError, match="--model-control-mode"):
        oceanus.Server(model_control_mode="sometimes")


def test_numpy_in_and_out_without_copies(server: oceanus.Server) -> None:
    model = server.model("simple")
    inputs = _pair(2)
    request = model.create_request(inputs=inputs)
    core_request = request._to_core()
    # The caller's arrays are the core's inputs (the ONNX backend reads them in place).
    assert all(t.data is inputs[t.name] for t in core_request.inputs)
    (response,) = model.infer(request)
    output = response.outputs["OUTPUT0"]
    first, second = np.from_dlpack(output), np.from_dlpack(output)
    assert first.ctypes.data == second.ctypes.data == np.asarray(output).ctypes.data
    assert first.tolist() == (inputs["INPUT0"] + 2).tolist()
    assert np.from_dlpack(response.outputs["OUTPUT1"]).tolist() == (inputs["INPUT0"] - 2).tolist()


def test_torch_tensors_through_dlpack(server: oceanus.Server) -> None:
    torch = pytest.importorskip("torch")
    data = torch.arange(32, dtype=torch.float32).reshape(2, 16)
    tensor = Tensor.from_dlpack(data)
    assert np.asarray(tensor).ctypes.data == data.data_ptr()  # shared, not copied
    (response,) = server.model("identity_fp32").infer(inputs={"INPUT0": data})
    result = torch.from_dlpack(response.outputs["OUTPUT0"])
    assert torch.equal(result, data)


def test_decoupled_responses_as_the_model_sends_them(server: oceanus.Server) -> None:
    responses = list(server.model("repeat").infer(inputs={"N": np.array([3], np.int32)}))
    values = [np.from_dlpack(r.outputs["I"]).tolist() for r in responses if r.outputs]
    assert values == [[0], [1], [2]]
    assert [r.parameters.get("index") for r in responses[:3]] == [0, 1, 2]
    assert [r.final for r in responses] == [False, False, False, True]
    assert responses[-1].outputs == {}  # the model sent the final flag alone
    with pytest.raises(oceanus.embedded.InvalidArgumentError, match="negative count"):
        list(server.model("repeat").infer(inputs={"N": np.array([-1], np.int32)}))


def test_async_infer_and_response_queue(server: oceanus.Server) -> None:
    async def scenario() -> list[list[int]]:
        model = server.model("simple")
        queue: asyncio.Queue[object] = asyncio.Queue()

        async def one(value: int) -> list[int]:
            request = model.create_request(inputs=_pair(value), response_queue=queue)
            answers = [r async for r in model.async_infer(request)]
            assert len(answers) == 1 and answers[0].final
            return np.from_dlpack(answers[0].outputs["OUTPUT0"])[0, :2].tolist()

        results = await asyncio.gather(*(one(v) for v in range(8)))
        assert queue.qsize() == 8  # each response also went to the caller's queue
        streamed = [
            r
            async for r in server.model("repeat").async_infer(inputs={"N": np.array([2], np.int32)})
        ]
        assert [r.final for r in streamed] == [False, False, True]
        return results

    assert asyncio.run(scenario()) == [[v, 1 + v] for v in range(8)]


def test_threads_share_the_dynamic_batcher(server: oceanus.Server) -> None:
    model = server.model("simple_dyna")
    before = model.statistics()["model_stats"][0]
    barrier = threading.Barrier(8)
    results: list[int] = []

    def caller(value: int) -> None:
        barrier.wait()
        for _ in range(25):
            (response,) = model.infer(inputs=_pair(value))
            results.append(int(np.from_dlpack(response.outputs["OUTPUT1"])[0, 0]))

    threads = [threading.Thread(target=caller, args=(v,)) for v in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == sorted(-v for v in range(8) for _ in range(25))
    after = model.statistics()["model_stats"][0]
    assert after["inference_count"] - before["inference_count"] == 200


def test_cancel_a_queued_request() -> None:
    # slow_fp32 (one instance, ~25 ms per execution): the second request waits in the queue
    # while the first executes, and leaves it when cancelled.
    with oceanus.Server(model_repository=example_repository(["slow_fp32"])) as server:
        model = server.model("slow_fp32")
        data = {"INPUT0": np.ones((1, 16), np.float32)}
        first = model.infer(inputs=data)
        second = model.infer(inputs=data)
        second.cancel()
        with pytest.raises(oceanus.embedded.CancelledError):
            next(second)
        assert next(first).final
