"""The throughput/latency frontier and the choice within a latency budget (pure functions)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

from oceanus.tune.measure import Measurement


def usable(points: Iterable[Measurement]) -> list[Measurement]:
    """Measurements that finished without errors."""
    return [p for p in points if not p.error and p.errors == 0 and p.p99_ms != float("inf")]


def frontier(points: Iterable[Measurement]) -> list[Measurement]:
    """The Pareto frontier: every measurement that no other beats on both throughput (higher)
    and p99 latency (lower), ordered by latency."""
    out: list[Measurement] = []
    best = -1.0
    for point in sorted(usable(points), key=lambda p: (p.p99_ms, -p.throughput)):
        if point.throughput > best:
            out.append(point)
            best = point.throughput
    return out


def best_within(points: Iterable[Measurement], budget_ms: float) -> Measurement | None:
    """The highest-throughput measurement whose p99 is within the budget."""
    inside = [p for p in points if p.within(budget_ms)]
    return max(inside, key=lambda p: p.throughput, default=None)


def score(points: Iterable[Measurement], budget_ms: float) -> float | None:
    """A configuration's worth: its best throughput within the budget (None: never within)."""
    best = best_within(points, budget_ms)
    return best.throughput if best is not None else None


def median_score(points: Sequence[Measurement], budget_ms: float) -> float | None:
    """Side-by-side rounds: per concurrency, the median throughput and median p99 over the
    rounds; the score is the best median throughput whose median p99 is within the budget."""
    by_level: dict[int, list[Measurement]] = {}
    for point in usable(points):
        by_level.setdefault(point.concurrency, []).append(point)
    best: float | None = None
    for level in by_level.values():
        throughput = statistics.median(p.throughput for p in level)
        p99 = statistics.median(p.p99_ms for p in level)
        if p99 <= budget_ms and (best is None or throughput > best):
            best = throughput
    return best
