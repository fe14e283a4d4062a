"""Statistics arithmetic (core/observability/statistics.py, the one source for /v2/models/stats and
the Prometheus metrics): what each request and execution adds, measured on a manual clock so every
duration is exact."""

from __future__ import annotations

from oceanus.core.errors import InferenceServerError
from oceanus.core.observability.statistics import ModelStatistics
from oceanus.core.server import ServerCore
from tests.core.fakes import IO_FP32, World, outcome, rows

MS = 1_000_000


def test_layout_and_sums() -> None:
    stats = ModelStatistics()
    stats.record_success(request_ns=10, queue_ns=3, input_ns=1, infer_ns=5, output_ns=1, rows=2)
    stats.record_success(request_ns=20, queue_ns=4, input_ns=2, infer_ns=6, output_ns=2, rows=1)
    stats.record_failure(7, "REJECTED")
    stats.record_execution(batch_size=3, input_ns=3, infer_ns=11, output_ns=3)
    stats.record_execution(batch_size=3, input_ns=1, infer_ns=1, output_ns=1)
    stats.record_cache_hit(request_ns=5, queue_ns=1, hit_ns=2)
    stats.record_cache_miss(4)
    entry = stats.as_dict("m", "1")
    assert entry["last_inference"] > 0
    del entry["last_inference"]
    assert entry == {
        "name": "m",
        "version": "1",
        "inference_count": 3,
        "execution_count": 2,
        "inference_stats": {
            # a cache miss's lookup time is added to the request's duration, as in Triton
            "success": {"count": 3, "ns": 10 + 20 + 5 + 4},
            "fail": {"count": 1, "ns": 7},
            "queue": {"count": 3, "ns": 3 + 4 + 1},
            "compute_input": {"count": 2, "ns": 3},
            "compute_infer": {"count": 2, "ns": 11},
            "compute_output": {"count": 2, "ns": 3},
            "cache_hit": {"count": 1, "ns": 2},
            "cache_miss": {"count": 1, "ns": 4},
        },
        "response_stats": {},
        "batch_stats": [
            {
                "batch_size": 3,
                "compute_input": {"count": 2, "ns": 4},
                "compute_infer": {"count": 2, "ns": 12},
                "compute_output": {"count": 2, "ns": 4},
            }
        ],
        "memory_usage": [],
    }
    assert stats.failures_by_reason == {"REJECTED": 1, "CANCELED": 0, "BACKEND": 0, "OTHER": 0}


def test_a_batch_adds_queue_compute_and_request_times_per_request(world: World) -> None:
    """Two requests wait 5 ms for the batch delay, then execute together for 2 ms: each is
    a 7 ms success with 5 ms queued and 2 ms of compute; the batch is one execution of 2."""
    world.add(
        "m",
        IO_FP32 + "dynamic_batching { preferred_batch_size: [ 4 ] "
        "max_queue_delay_microseconds: 5000 }",
        max_batch_size=8,
    )
    world.model("m").execution_ns = 2 * MS

    async def scenario(core: ServerCore) -> None:
        futures = [core.infer(world.request("m", rows(1, i)), "test") for i in range(2)]
        world.clock.advance(5 * MS)
        for future in futures:
            await outcome(future)
        entry = core.statistics("m")[0]
        stats = entry["inference_stats"]
        assert (entry["inference_count"], entry["execution_count"]) == (2, 1)
        assert stats["success"] == {"count": 2, "ns": 2 * 7 * MS}
        assert stats["queue"] == {"count": 2, "ns": 2 * 5 * MS}
        assert stats["compute_infer"] == {"count": 2, "ns": 2 * 2 * MS}
        assert stats["compute_input"] == {"count": 2, "ns": 0}
        assert stats["compute_output"] == {"count": 2, "ns": 0}
        assert stats["fail"] == {"count": 0, "ns": 0}
        assert entry["batch_stats"] == [
            {
                "batch_size": 2,
                "compute_input": {"count": 1, "ns": 0},
                "compute_infer": {"count": 1, "ns": 2 * MS},
                "compute_output": {"count": 1, "ns": 0},
            }
        ]

    world.run(scenario)


def test_failures_count_their_whole_duration_and_reason(world: World) -> None:
    world.add("m", IO_FP32, max_batch_size=8)
    model = world.model("m")
    model.execution_ns = 3 * MS
    model.next_failures.append(RuntimeError("broken"))
    model.hold()

    async def scenario(core: ServerCore) -> None:
        failing = core.infer(world.request("m", rows()), "test")
        await model.wait_executions(1)
        cancelled = core.infer(world.request("m", rows()), "test")
        world.clock.advance(1 * MS)
        cancelled.cancel()
        model.release_all()
        assert isinstance(await outcome(failing), InferenceServerError)
        await outcome(core.infer(world.request("m", rows()), "test"))
        entry = core.statistics("m")[0]
        stats = entry["inference_stats"]
        # failing: held 1 ms, then 3 ms executing; cancelled: arrived at the same time and
        # dropped when the next batch formed, as the failing one finished: 4 ms each
        assert stats["fail"] == {"count": 2, "ns": 4 * MS + 4 * MS}
        assert stats["success"] == {"count": 1, "ns": 3 * MS}
        assert entry["execution_count"] == 2  # the failed execution counts, as in Triton
        failures = core.resolve("m").stats.failures_by_reason
        assert (failures["BACKEND"], failures["CANCELED"]) == (1, 1)

    world.run(scenario)


def test_each_version_counts_on_its_own(world: World) -> None:
    world.add("m", IO_FP32 + "version_policy: { all { } }", max_batch_size=8, versions=(1, 2))

    async def scenario(core: ServerCore) -> None:
        for version in ("1", "2", "2"):
            await core.infer(world.request("m", rows(), model_version=version), "test")
        counts = {s["version"]: s["inference_count"] for s in core.statistics("m")}
        assert counts == {"1": 1, "2": 2}
        assert [s["version"] for s in core.statistics("m", "2")] == ["2"]
        assert [s["name"] for s in core.statistics()] == ["m", "m"]

    world.run(scenario)
