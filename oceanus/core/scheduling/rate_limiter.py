"""Triton's rate limiter: server-wide resources that model instances hold while they execute.

`--rate-limit=execution_count` turns it on (`off`, the default, ignores every `rate_limiter`
block); `--rate-limit-resource=NAME:COUNT[:DEVICE]` sets how many of a resource exist;
`instance_group { rate_limiter { resources [ { name count global } ] priority } }` says what each
instance of a group needs and how it weighs against other instances. Semantics follow core
src/rate_limiter.cc and server docs/user_guide/rate_limiter.md:

- resources are counted per device (an instance's device id; CPU instances are device 0); a
  resource an instance declares `global: true` is one pool for all devices;
- without `--rate-limit-resource`, a resource exists as many times as the largest count any
  loaded instance asks for; with it, a resource the flags do not name exists 0 times, and an
  instance that needs more than exists fails its model's load (Triton's text);
- an idle instance with a batch to run is *staged*; the staged instance with the lowest
  execution count x priority (priority 0 counts as 1) runs first, once every resource it needs
  is free. Only the head of that order is tried, as in Triton: an instance that does not fit
  holds back the ones behind it until resources are released;
- the time a batch waits here is queue time in the statistics (its requests have not started).

Everything runs on the event loop, so nothing here takes a lock.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from tritonclient.grpc import model_config_pb2 as mc

from oceanus.core.errors import invalid_arg

Batch = list[Any]  # a scheduler's formed batch (its jobs)
Instance = TypeVar("Instance", bound=Hashable)

log = logging.getLogger("oceanus.core.rate_limiter")

GLOBAL = -2  # a resource declared `global: true`, shared by every device
PER_DEVICE = -1  # a --rate-limit-resource without a device: applies to each device

MODES = ("execution_count", "off")


@dataclass(frozen=True, slots=True)
class ResourceLimit:
    """One `--rate-limit-resource` flag."""

    name: str
    count: int
    device: int = PER_DEVICE


def parse_mode(text: str) -> str:
    """`--rate-limit` (case-insensitive, as in Triton)."""
    mode = text.strip().lower()
    if mode not in MODES:
        raise ValueError("invalid argument for --rate-limit")
    return mode


def parse_resource(text: str) -> ResourceLimit:
    """`--rate-limit-resource=<name>:<count>[:<device>]` (Triton's parser and error text)."""
    error = (
        "--rate-limit-resource option format is '<resource_name>:<count>:<device>' or "
        f"'<resource_name>:<count>'. Got {text}"
    )
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(error)
    try:
        count = int(parts[1])
        device = int(parts[2]) if len(parts) == 3 else PER_DEVICE
    except ValueError:
        raise ValueError(error) from None
    return ResourceLimit(parts[0], count, device)


def instance_rate_limits(config: mc.ModelConfig) -> list[mc.ModelRateLimiter]:
    """Each instance's `rate_limiter` block, in the order instances are created (one per
    instance of each group, groups in config order)."""
    return [
        group.rate_limiter for group in config.instance_group for _ in range(max(group.count, 1))
    ]


@dataclass(eq=False, slots=True)
class LimitedInstance:
    """One model instance as the rate limiter sees it."""

    name: str
    needs: dict[tuple[int, str], int]  # (device or GLOBAL, resource) -> count
    priority: int
    executions: int = 0
    on_allocate: Callable[[], None] | None = field(default=None, repr=False)

    @property
    def scaled_priority(self) -> int:
        return self.executions * self.priority


class RateLimiter:
    """The server's one rate limiter (core/server.py owns it; schedulers stage instances)."""

    def __init__(self, mode: str = "off", resources: Sequence[ResourceLimit] = ()) -> None:
        self.enabled = mode == "execution_count"
        self._explicit: dict[tuple[int, str], int] = {}
        for limit in resources:
            key = (limit.device, limit.name)
            self._explicit[key] = max(self._explicit.get(key, 0), limit.count)
        self._instances: set[LimitedInstance] = set()
        self._available: dict[tuple[int, str], int] = {}
        self._allocated: dict[tuple[int, str], int] = {}
        self._staged: list[tuple[int, int, LimitedInstance]] = []
        self._order = itertools.count()

    # ---- instances come and go with their models ------------------------------------------

    def gate(
        self,
        model: str,
        config: mc.ModelConfig,
        workers: Sequence[Instance],
        devices: Sequence[int],
    ) -> ModelGate[Instance] | None:
        """A model version's gate to the limiter; None when rate limiting is off."""
        instances = self.register(model, instance_rate_limits(config), devices)
        if instances is None:
            return None
        return ModelGate(self, dict(zip(workers, instances, strict=True)))

    def register(
        self, model: str, limits: Sequence[mc.ModelRateLimiter], devices: Sequence[int]
    ) -> list[LimitedInstance] | None:
        """Add a model version's instances; None when rate limiting is off. Raises
        INVALID_ARG (Triton's texts) when the resources cannot ever let one of them run."""
        if not self.enabled:
            return None
        added: list[LimitedInstance] = []
        for index, (limit, device) in enumerate(zip(limits, devices, strict=True)):
            needs: dict[tuple[int, str], int] = {}
            for resource in limit.resources:
                key = (GLOBAL if getattr(resource, "global") else device, resource.name)
                needs[key] = resource.count
            added.append(LimitedInstance(f"{model}_{index}", needs, max(limit.priority, 1)))
        self._instances.update(added)
        try:
            self._compute_available()
        except Exception:
            self._instances.difference_update(added)
            self._compute_available()
            raise
        return added

    def unregister(self, instances: Sequence[LimitedInstance] | None) -> None:
        if not instances:
            return
        self._instances.difference_update(instances)
        self._staged = [entry for entry in self._staged if entry[2] not in instances]
        heapq.heapify(self._staged)
        self._compute_available()
        self._attempt()

    def _compute_available(self) -> None:
        """The count of each resource: the largest need of any instance, or what the flags say
        (checked against those needs), as ResourceManager::ParseAndValidateResources does."""
        largest: dict[tuple[int, str], int] = {}
        for instance in self._instances:
            for key, count in instance.needs.items():
                largest[key] = max(largest.get(key, 0), count)
        global_names = {name for device, name in largest if device == GLOBAL}
        for device, name in largest:
            if device != GLOBAL and name in global_names:
                raise invalid_arg(
                    f'Resource "{name}" is present as both global and device-specific resource '
                    "in the model configuration."
                )
        if not self._explicit:
            self._available = largest
            return
        available: dict[tuple[int, str], int] = {}
        for (device, name), needed in largest.items():
            if device == GLOBAL:
                counts = [c for (_, n), c in self._explicit.items() if n == name]
            else:
                counts = [
                    c
                    for (d, n), c in self._explicit.items()
                    if n == name and d in (device, PER_DEVICE)
                ]
            count = max(counts, default=0)
            if count < needed:
                raise invalid_arg(
                    f'Resource count for "{name}" is limited to {count} which will prevent '
                    "scheduling of one or more model instances, the minimum required count is "
                    f"{needed}"
                )
            available[(device, name)] = count
        self._available = available

    # ---- staging and release (schedulers, on the loop) --------------------------------------

    def stage(self, instance: LimitedInstance, on_allocate: Callable[[], None]) -> None:
        """The instance has a batch to run: `on_allocate` is called (maybe at once) once the
        instance is first in priority order and its resources are free."""
        instance.on_allocate = on_allocate
        heapq.heappush(self._staged, (instance.scaled_priority, next(self._order), instance))
        self._attempt()

    def release(self, instance: LimitedInstance) -> None:
        """The instance finished its batch: count the execution and free its resources."""
        instance.executions += 1
        for key, count in instance.needs.items():
            self._allocated[key] = self._allocated.get(key, 0) - count
        self._attempt()

    def _fits(self, instance: LimitedInstance) -> bool:
        return all(
            self._allocated.get(key, 0) + count <= self._available.get(key, 0)
            for key, count in instance.needs.items()
        )

    def _attempt(self) -> None:
        while self._staged:
            instance = self._staged[0][2]
            if not self._fits(instance):
                return
            heapq.heappop(self._staged)
            for key, count in instance.needs.items():
                self._allocated[key] = self._allocated.get(key, 0) + count
            callback, instance.on_allocate = instance.on_allocate, None
            if callback is not None:
                callback()

    def summary(self) -> str:
        """The resource table Triton logs at verbose level 1."""
        lines = ["Max Resource Map===>"]
        for device in sorted({d for d, _ in self._available}):
            lines.append(f"\tDevice: {'GLOBAL' if device == GLOBAL else device}")
            for (d, name), count in sorted(self._available.items()):
                if d == device:
                    lines.append(f"\t\tResource: {name}\t Count: {count}")
        return "\n".join(lines)


class ModelGate(Generic[Instance]):
    """One model version's instances behind the rate limiter (its scheduler's view): which idle
    instance takes the next batch, and a formed batch waiting for its instance's resources."""

    def __init__(self, limiter: RateLimiter, instances: dict[Instance, LimitedInstance]) -> None:
        self._limiter = limiter
        self._instances = instances
        self._waiting: dict[Instance, Batch] = {}

    def take_idle(self, idle: list[Instance]) -> Instance:
        """The idle instance to get the next batch: the lowest execution count x priority, as
        Triton picks the model's available instance."""
        best = min(range(len(idle)), key=lambda i: self._instances[idle[i]].scaled_priority)
        return idle.pop(best)

    def stage(self, worker: Instance, batch: Batch, run: Callable[[Instance, Batch], None]) -> None:
        """`run(worker, batch)` once the limiter allocates the instance's resources."""
        self._waiting[worker] = batch

        def allocated() -> None:
            if self._waiting.pop(worker, None) is not None:
                run(worker, batch)

        self._limiter.stage(self._instances[worker], allocated)

    def release(self, worker: Instance) -> None:
        self._limiter.release(self._instances[worker])

    def close(self) -> list[Batch]:
        """Leave the limiter; the batches still waiting for resources, to fail."""
        waiting = list(self._waiting.values())
        self._waiting.clear()
        self._limiter.unregister(list(self._instances.values()))
        return waiting
