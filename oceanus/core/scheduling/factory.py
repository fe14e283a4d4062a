"""Which scheduler a model version gets, from its config's scheduling choice."""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as mc

from oceanus.core.clock import MONOTONIC, Clock
from oceanus.core.observability.statistics import ModelStatistics
from oceanus.core.scheduling.dynamic_batch import JobDone, Scheduler
from oceanus.core.scheduling.instance import InstanceThread
from oceanus.core.scheduling.sequence import SequenceScheduler
from oceanus.core.scheduling.sequence_oldest import OldestSequenceScheduler


def make_scheduler(
    config: mc.ModelConfig,
    workers: list[InstanceThread],
    stats: ModelStatistics,
    on_job_done: JobDone,
    clock: Clock = MONOTONIC,
) -> Scheduler:
    """The dynamic batcher (or none), or the sequence batcher with its strategy."""
    if not config.HasField("sequence_batching"):
        return Scheduler(config, workers, stats, on_job_done, clock)
    if config.sequence_batching.HasField("oldest"):
        return OldestSequenceScheduler(config, workers, stats, on_job_done, clock)
    return SequenceScheduler(config, workers, stats, on_job_done, clock)
