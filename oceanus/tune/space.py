"""The settings `oceanus tune` tries: what a candidate is, how it becomes a config, and which
candidates are worth trying given the model and the machine.

A candidate fixes the four settings that decide throughput and latency on a given machine:
instance count, max batch size, dynamic batching (preferred sizes, max queue delay) on or off.
Everything else in the config (inputs, outputs, parameters, warmup, ...) stays as shipped.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

from tritonclient.grpc import model_config_pb2 as mc

from oceanus.cpus import usable_cpus

# Queue delays tried (µs), each only when it is at most a quarter of the latency budget.
QUEUE_DELAYS_US = (100, 500, 2000)
# The largest max batch size tried.
MAX_BATCH_LIMIT = 256
# The most instances tried on CPUs, whatever the core count.
MAX_CPU_INSTANCES = 8


@dataclass(frozen=True)
class Candidate:
    instances: int
    max_batch_size: int
    dynamic_batching: bool
    # Preferred batch sizes (empty: Triton's default, the max batch size).
    preferred: tuple[int, ...] = ()
    delay_us: int = 0
    # The repository's own config, loaded as it is (no override).
    shipped: bool = False

    @property
    def key(self) -> tuple[int, int, bool, tuple[int, ...], int]:
        """What decides behaviour: two candidates with the same key are the same config."""
        preferred = self.preferred if self.preferred else (self.max_batch_size,)
        if not self.dynamic_batching:
            return (self.instances, self.max_batch_size, False, (), 0)
        return (self.instances, self.max_batch_size, True, preferred, self.delay_us)

    def label(self) -> str:
        parts = [f"{self.instances} instance{'s' if self.instances != 1 else ''}"]
        if self.max_batch_size > 0:
            parts.append(f"max batch {self.max_batch_size}")
        if self.dynamic_batching:
            batching = "dynamic batching"
            if self.preferred and self.preferred != (self.max_batch_size,):
                batching += f", preferred {list(self.preferred)}"
            if self.delay_us:
                batching += f", delay {self.delay_us} µs"
            parts.append(batching)
        elif self.max_batch_size > 0:
            parts.append("no dynamic batching")
        return ", ".join(parts)

    def as_dict(self) -> dict[str, object]:
        return {
            "instances": self.instances,
            "max_batch_size": self.max_batch_size,
            "dynamic_batching": self.dynamic_batching,
            "preferred_batch_size": list(self.preferred),
            "max_queue_delay_microseconds": self.delay_us,
            "shipped": self.shipped,
        }


def from_config(config: mc.ModelConfig) -> Candidate:
    """The shipped config as a candidate (its normalized form, as the server loaded it)."""
    batching = config.dynamic_batching
    return Candidate(
        instances=sum(max(group.count, 1) for group in config.instance_group) or 1,
        max_batch_size=config.max_batch_size,
        dynamic_batching=config.HasField("dynamic_batching"),
        preferred=tuple(batching.preferred_batch_size),
        delay_us=int(batching.max_queue_delay_microseconds),
        shipped=True,
    )


def apply(config: mc.ModelConfig, candidate: Candidate) -> mc.ModelConfig:
    """`config` with the candidate's settings (a copy; the rest of the config is kept)."""
    out = copy.deepcopy(config)
    out.max_batch_size = candidate.max_batch_size
    first = config.instance_group[0] if config.instance_group else None
    del out.instance_group[:]
    group = out.instance_group.add(count=candidate.instances)
    if first is not None:
        group.kind = first.kind
        group.gpus.extend(first.gpus)
        if first.name:
            group.name = first.name
    if candidate.dynamic_batching:
        batching = out.dynamic_batching
        del batching.preferred_batch_size[:]
        batching.preferred_batch_size.extend(candidate.preferred)
        batching.max_queue_delay_microseconds = candidate.delay_us
    else:
        out.ClearField("dynamic_batching")
    return out


class Space:
    """Bounds of the search for one model on one machine."""

    def __init__(
        self, config: mc.ModelConfig, latency_budget_ms: float, cpus: int | None = None
    ) -> None:
        self.shipped = from_config(config)
        self.cpus = cpus or usable_cpus()
        gpu = any(g.kind == mc.ModelInstanceGroup.KIND_GPU for g in config.instance_group)
        limit = 4 if gpu else min(self.cpus, MAX_CPU_INSTANCES)
        counts = {1, limit, self.shipped.instances}
        counts.update(n for n in (2, 4, 8) if n <= limit)
        self.instance_counts = sorted(counts)
        # Dynamic batching needs a batching model without its own sequence scheduler.
        self.can_batch = config.max_batch_size > 0 and not (
            config.HasField("sequence_batching") or config.model_transaction_policy.decoupled
        )
        budget_us = latency_budget_ms * 1000.0
        self.delays_us = [d for d in QUEUE_DELAYS_US if d <= budget_us / 4]

    def first_stage(self) -> list[Candidate]:
        """Every instance count, with and without dynamic batching (no delay)."""
        base = self.shipped.max_batch_size
        out = []
        for count in self.instance_counts:
            out.append(Candidate(count, base, False))
            if self.can_batch:
                out.append(Candidate(count, base, True))
        return out

    def neighbors(self, candidate: Candidate) -> list[tuple[str, Candidate]]:
        """Configurations one step from `candidate`, each with the setting it changes, the
        likeliest gains first: dynamic batching on; twice the max batch size; each other queue
        delay; preferred sizes below the maximum (with a delay); half the max batch size; the
        neighbouring instance counts."""
        base = replace(candidate, shipped=False)
        out: list[tuple[str, Candidate]] = []
        if self.can_batch and not base.dynamic_batching:
            out.append(("dynamic batching", replace(base, dynamic_batching=True, delay_us=0)))
        if self.can_batch and base.dynamic_batching:
            size = base.max_batch_size
            if size * 2 <= MAX_BATCH_LIMIT:
                out.append(("max batch size", replace(base, max_batch_size=size * 2, preferred=())))
            for delay in (0, *self.delays_us):
                if delay != base.delay_us:
                    out.append(("queue delay", replace(base, delay_us=delay)))
            if base.delay_us > 0 and size // 2 >= 2 and base.preferred in ((), (size,)):
                out.append(("preferred batch sizes", replace(base, preferred=(size // 2, size))))
            if size // 2 >= 1 and size // 2 >= self.shipped.max_batch_size // 2:
                out.append(
                    ("max batch size", replace(base, max_batch_size=size // 2, preferred=()))
                )
        index = (
            self.instance_counts.index(base.instances)
            if base.instances in self.instance_counts
            else -1
        )
        for other in (index + 1, index - 1):
            if index >= 0 and 0 <= other < len(self.instance_counts):
                out.append(("instances", replace(base, instances=self.instance_counts[other])))
        return out
