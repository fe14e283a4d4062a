"""The rate limiter (core/scheduling/rate_limiter.py): Triton's resource accounting, errors and
priority order as rules, then two fake instances that need one R1 each, in the core: with
--rate-limit=execution_count and one R1 they run one after the other (the wait counted as
queue time), with it off they run together (as Triton 2.51 does: docs/rate-limiter.md). The
same with real Python models over the wire: tests/frontends/test_scheduling_wire.py."""

from __future__ import annotations

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.cli import parse_args
from oceanus.core.errors import InferenceServerError
from oceanus.core.scheduling.rate_limiter import (
    PER_DEVICE,
    RateLimiter,
    ResourceLimit,
    parse_mode,
    parse_resource,
)
from oceanus.core.server import ServerCore
from oceanus.core.types import InferResponse
from tests.core.fakes import IO_FP32, World, outcome, rows


def limits(
    *needs: dict[str, int], priority: int = 0, shared: bool = False
) -> list[mc.ModelRateLimiter]:
    out = []
    for need in needs:
        limiter = mc.ModelRateLimiter(priority=priority)
        for name, count in need.items():
            resource = limiter.resources.add(name=name, count=count)
            setattr(resource, "global", shared)
        out.append(limiter)
    return out


def test_flags_parse_as_triton_parses_them() -> None:
    assert parse_mode("Execution_Count") == "execution_count"
    assert parse_resource("R1:4") == ResourceLimit("R1", 4, PER_DEVICE)
    assert parse_resource("R1:4:1") == ResourceLimit("R1", 4, 1)
    for bad in ("R1", "R1:1:2:3", "R1:x"):
        with pytest.raises(ValueError, match="'<resource_name>:<count>:<device>' or"):
            parse_resource(bad)
    with pytest.raises(ValueError, match="invalid argument for --rate-limit"):
        parse_mode("fast")
    settings, ignored = parse_args(
        [
            "--rate-limit=execution_count",
            "--rate-limit-resource=R1:1",
            "--rate-limit-resource=R2:2:0",
        ]
    )
    assert settings.rate_limit == "execution_count"
    assert settings.rate_limit_resources == [ResourceLimit("R1", 1), ResourceLimit("R2", 2, 0)]
    assert "--rate-limit" not in ignored
    with pytest.raises(SystemExit):
        parse_args(["--rate-limit=fast"])


def test_off_ignores_every_rate_limiter_block() -> None:
    assert RateLimiter("off").register("m", limits({"R1": 5}), [0]) is None


def test_counts_default_to_the_largest_need_and_flags_must_cover_it() -> None:
    limiter = RateLimiter("execution_count")
    a, b = limiter.register("m", limits({"R1": 2}, {"R1": 3}), [0, 0]) or []
    ran: list[str] = []
    limiter.stage(a, lambda: ran.append("a"))
    limiter.stage(b, lambda: ran.append("b"))  # 2 + 3 > 3: waits for a
    assert ran == ["a"]
    limiter.release(a)
    assert ran == ["a", "b"]
    explicit = RateLimiter("execution_count", [ResourceLimit("R1", 2)])
    with pytest.raises(InferenceServerError) as error:
        explicit.register("m", limits({"R1": 3}), [0])
    assert error.value.message == (
        'Resource count for "R1" is limited to 2 which will prevent scheduling of one or more '
        "model instances, the minimum required count is 3"
    )
    # A device-specific flag covers that device only; a resource the flags omit has none.
    on_device_1 = RateLimiter("execution_count", [ResourceLimit("R1", 5, 1)])
    with pytest.raises(InferenceServerError, match="limited to 0"):
        on_device_1.register("m", limits({"R1": 1}), [0])
    assert on_device_1.register("m", limits({"R1": 1}), [1]) is not None


def test_a_resource_is_global_or_per_device_never_both() -> None:
    limiter = RateLimiter("execution_count")
    limiter.register("a", limits({"R1": 1}, shared=True), [0])
    with pytest.raises(InferenceServerError) as error:
        limiter.register("b", limits({"R1": 1}), [0])
    assert error.value.message == (
        'Resource "R1" is present as both global and device-specific resource in the model '
        "configuration."
    )
    # The failed registration left nothing behind: the global R1 still works.
    (only,) = limiter.register("c", limits({"R1": 1}, shared=True), [1]) or []
    ran: list[str] = []
    limiter.stage(only, lambda: ran.append("c"))
    assert ran == ["c"]


def test_lowest_execution_count_times_priority_goes_first() -> None:
    limiter = RateLimiter("execution_count")
    (busy,) = limiter.register("busy", limits({"R1": 1}), [0]) or []
    (fast,) = limiter.register("fast", limits({"R1": 1}, priority=1), [0]) or []
    (slow,) = limiter.register("slow", limits({"R1": 1}, priority=3), [0]) or []
    order: list[str] = []
    limiter.stage(busy, lambda: order.append("busy"))  # holds R1 while the others stage
    fast.executions, slow.executions = 2, 1  # scaled priorities 2 and 3
    limiter.stage(slow, lambda: order.append("slow"))
    limiter.stage(fast, lambda: order.append("fast"))
    limiter.release(busy)
    assert order == ["busy", "fast"]
    limiter.release(fast)
    assert order == ["busy", "fast", "slow"]


MS = 1_000_000
# Two instances that each need the one R1 (Triton 2.51 runs them one after the other under
# --rate-limit=execution_count, together without it: docs/rate-limiter.md).
LIMITED = (
    IO_FP32
    + """
instance_group [ { count: 2 kind: KIND_CPU
  rate_limiter { resources [ { name: "R1" count: 1 } ] } } ]
"""
)
ONE_R1 = {"rate_limit": "execution_count", "rate_limit_resources": [ResourceLimit("R1", 1)]}


def test_one_resource_serializes_two_instances(world: World) -> None:
    world.add("limited", LIMITED, max_batch_size=1)
    model = world.model("limited")
    model.hold()

    async def scenario(core: ServerCore) -> None:
        futures = [core.infer(world.request("limited", rows()), "test") for _ in range(2)]
        await model.wait_executions(1)
        world.clock.advance(5 * MS)
        # The second holds no R1 while the first executes, so it has not reached an instance.
        assert len(model.executed) == 1
        model.release_all()
        for future in futures:
            assert isinstance(await outcome(future), InferResponse)
        assert {e.instance for e in model.executed} == {"limited_0_0", "limited_0_1"}
        queue = core.statistics("limited")[0]["inference_stats"]["queue"]
        assert queue == {"count": 2, "ns": 5 * MS}  # the wait for R1 is queue time

    world.run(scenario, **ONE_R1)


def test_without_the_flag_both_run_at_once(world: World) -> None:
    world.add("limited", LIMITED, max_batch_size=1)
    model = world.model("limited")
    model.hold()

    async def scenario(core: ServerCore) -> None:
        futures = [core.infer(world.request("limited", rows()), "test") for _ in range(2)]
        await model.wait_executions(2)  # both execute, held, at the same time
        model.release_all()
        for future in futures:
            assert isinstance(await outcome(future), InferResponse)

    world.run(scenario)


def test_a_flag_that_cannot_cover_an_instance_fails_its_load(world: World) -> None:
    world.add("limited", LIMITED, max_batch_size=1)

    async def scenario(core: ServerCore) -> list[tuple[str, str]]:
        return core.load_failures()

    failures = world.run(
        scenario, rate_limit="execution_count", rate_limit_resources=[ResourceLimit("R2", 1)]
    )
    assert failures and failures[0][0] == "limited"
    assert 'Resource count for "R1" is limited to 0' in failures[0][1]
