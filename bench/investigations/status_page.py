"""What the status page costs the server: the per-request cost of the recent latency window
(only once a page has asked for it), and the time to build one /status.json document.

    python bench/investigations/status_page.py [--models 20] [--requests 200000]

Prints a table and writes bench/results/status_page.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from oceanus.core.model import ModelState, ModelVersion
from oceanus.core.observability.custom_metrics import CustomMetricRegistry
from oceanus.core.observability.statistics import ModelStatistics
from oceanus.frontends.metrics.status import RECENT_WINDOW_S, models

RESULTS = Path(__file__).resolve().parent.parent / "results"


def per_request_ns(stats: ModelStatistics, requests: int) -> float:
    record = stats.record_success
    started = time.perf_counter_ns()
    for i in range(requests):
        record(250_000 + (i & 1023) * 100, 5_000, 1_000, 30_000, 1_000, 1)
    return (time.perf_counter_ns() - started) / requests


class Entry:
    def __init__(self, version: ModelVersion) -> None:
        self.name = version.name
        self.versions = {1: version}
        self.error = ""


class Core:
    """What `status.models` reads, over real ModelVersions and statistics."""

    def __init__(self, count: int) -> None:
        self.custom_metrics = CustomMetricRegistry()  # no language model: no vllm:* figures
        self.models = {}
        for index in range(count):
            config = mc.ModelConfig(name=f"model_{index}", backend="onnxruntime", max_batch_size=8)
            config.instance_group.add(count=2, kind=mc.ModelInstanceGroup.KIND_CPU)
            version = ModelVersion(config.name, 1, config, Path("unused"))
            version.state = ModelState.READY
            for size in range(1, 9):
                version.stats.record_execution(size, 1_000, 20_000, 1_000)
            self.models[config.name] = Entry(version)

    def cache_enabled(self, model: ModelVersion) -> bool:
        return False

    def repository_index(self) -> list[dict[str, str]]:
        return [{"name": name, "version": "1", "state": "READY"} for name in self.models]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=20)
    parser.add_argument("--requests", type=int, default=200_000)
    args = parser.parse_args(argv)

    rounds = []
    for _ in range(3):  # alternate, so that both see the same machine
        plain = ModelStatistics()
        watched = ModelStatistics()
        watched.watch_recent(RECENT_WINDOW_S)
        pair = (per_request_ns(plain, args.requests), per_request_ns(watched, args.requests))
        rounds.append(pair)
    plain_ns = sorted(r[0] for r in rounds)[1]
    watched_ns = sorted(r[1] for r in rounds)[1]

    core = Core(args.models)
    models(core)  # type: ignore[arg-type]  # starts the windows
    builds = []
    for _ in range(200):
        started = time.perf_counter_ns()
        document = models(core)  # type: ignore[arg-type]
        builds.append(time.perf_counter_ns() - started)
    builds.sort()
    size = len(json.dumps(document))

    median_us = builds[len(builds) // 2] / 1e3
    rows = [
        ("record_success, nobody watching", f"{plain_ns:.0f} ns"),
        ("record_success, page watching", f"{watched_ns:.0f} ns (+{watched_ns - plain_ns:.0f})"),
        (f"/status.json models, {args.models} versions", f"{median_us:.0f} µs"),
        ("document size", f"{size / 1000:.1f} kB"),
    ]
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "status_page.json").write_text(
        json.dumps(
            {
                "record_success_ns": plain_ns,
                "record_success_watched_ns": watched_ns,
                "document_models_us_median": median_us,
                "models": args.models,
                "document_bytes": size,
            },
            indent=2,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
