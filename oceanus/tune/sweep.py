"""The search: which configurations to measure, in what order, within the time budget.

1. The shipped config, at concurrency 1, 2, 4, ... until p99 leaves the budget or throughput
   stops growing (two levels without a 5 % gain).
2. Every instance count, with and without dynamic batching.
3. From the best so far: 2x and 4x the max batch size (while it helps).
4. From the best so far: max queue delays (each at most a quarter of the budget), then
   preferred batch sizes below the maximum.
5. Side by side: the shipped and the best config measured in alternating rounds (ABBA) at the
   concurrencies where each did best, so that both see the same machine; the best replaces the
   shipped one only if it wins there by at least MIN_GAIN.

Each configuration after the first starts its ladder at a quarter of the best concurrency seen
so far. Before every measurement the clock is checked against what the side-by-side still needs.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.tune import frontier
from oceanus.tune.measure import Measurement, Meter
from oceanus.tune.space import Candidate, Space, apply
from oceanus.tune.target import Target, TuneError

# A configuration replaces the shipped one only if it serves this much more, side by side.
MIN_GAIN = 0.02
# A concurrency level counts as a gain when it serves this much more than the best before it.
LEVEL_GAIN = 0.05
SIDE_BY_SIDE_ROUNDS = 3
# Kept back for stopping the server and writing the report.
FINISH_S = 4.0


class Clock:
    def __init__(self, seconds: float) -> None:
        self.start = time.monotonic()
        self.deadline = self.start + seconds

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return self.deadline - time.monotonic()


class Progress:
    """One line per step, prefixed with the elapsed time."""

    def __init__(self, clock: Clock, stream: TextIO = sys.stderr) -> None:
        self.clock = clock
        self.stream = stream

    def __call__(self, text: str) -> None:
        print(f"[{self.clock.elapsed():5.0f}s] {text}", file=self.stream, flush=True)


@dataclass
class Trial:
    id: int
    candidate: Candidate
    stage: str
    points: list[Measurement] = field(default_factory=list)
    side_points: list[Measurement] = field(default_factory=list)
    load_error: str = ""


@dataclass
class Outcome:
    trials: list[Trial]
    shipped: Trial
    best: Trial | None  # the best configuration of the sweep (None: none within the budget)
    recommended: Trial | None  # after the side-by-side (None: none within the budget)
    shipped_score: float | None = None  # side by side (or the sweep's, when best is shipped)
    recommended_score: float | None = None
    side_by_side_rounds: int = 0
    notes: list[str] = field(default_factory=list)


def describe(point: Measurement) -> str:
    if point.error:
        return f"c={point.concurrency:<4} failed: {point.error}"
    batch = f"   batch {point.avg_batch:4.2f}" if point.avg_batch is not None else ""
    errors = f"   {point.errors} errors" if point.errors else ""
    return (
        f"c={point.concurrency:<4} {point.throughput:10,.0f} infer/s   p50 {point.p50_ms:7.2f} ms"
        f"   p99 {point.p99_ms:7.2f} ms{batch}{errors}"
    )


class Sweep:
    def __init__(
        self,
        target: Target,
        model: str,
        base_config: mc.ModelConfig,
        space: Space,
        meter: Meter,
        budget_ms: float,
        clock: Clock,
        window_s: float,
        max_concurrency: int,
        progress: Callable[[str], None],
    ) -> None:
        self.target = target
        self.model = model
        self.base_config = base_config
        self.space = space
        self.meter = meter
        self.budget_ms = budget_ms
        self.clock = clock
        self.window_s = window_s
        self.levels = [1 << i for i in range(16) if (1 << i) <= max(1, max_concurrency)]
        self.progress = progress
        self.trials: list[Trial] = []
        self.out_of_time = False
        self._point_s = window_s + 0.6  # running estimates of what a step costs
        self._load_s = 1.0

    # ---- time -------------------------------------------------------------------------------

    def _reserve(self) -> float:
        """What the side-by-side round and the finish still need."""
        return 2 * self._load_s + 4 * self._point_s + FINISH_S

    def _can_measure(self) -> bool:
        if self.clock.left() >= self._reserve() + self._point_s:
            return True
        self.out_of_time = True
        return False

    # ---- one configuration --------------------------------------------------------------------

    def _load(self, candidate: Candidate) -> None:
        started = time.monotonic()
        if candidate.shipped:
            self.target.load(self.model)
        else:
            config = apply(self.base_config, candidate)
            self.target.load(
                self.model, json_format.MessageToDict(config, preserving_proto_field_name=True)
            )
        self._load_s = 0.5 * self._load_s + 0.5 * (time.monotonic() - started)

    def _measure(self, trial: Trial, phase: str, concurrency: int) -> Measurement:
        point = self.meter.measure(trial.id, phase, concurrency, self.window_s)
        self._point_s = 0.5 * self._point_s + 0.5 * point.seconds
        self.progress(f"    #{trial.id} {describe(point)}")
        return point

    def _first_level(self) -> int:
        points = [p for t in self.trials for p in t.points]
        best = frontier.best_within(points, self.budget_ms)
        if best is None:
            return 0
        start = max(1, best.concurrency // 4)
        return max(i for i, level in enumerate(self.levels) if level <= start)

    def trial(self, candidate: Candidate, stage: str) -> Trial | None:
        """Load and measure one configuration (None: a duplicate, or no time left)."""
        if any(t.candidate.key == candidate.key for t in self.trials):
            return None
        if self.out_of_time or not self._can_measure():
            return None
        trial = Trial(len(self.trials) + 1, candidate, stage)
        first = self._first_level()
        self.trials.append(trial)
        self.progress(f"#{trial.id} {candidate.label()}{' (shipped)' if candidate.shipped else ''}")
        try:
            self._load(candidate)
        except TuneError as exc:
            trial.load_error = str(exc)
            self.progress(f"    #{trial.id} did not load: {exc}")
            return trial
        best = 0.0
        flat = 0
        for concurrency in self.levels[first:]:
            if not self._can_measure():
                break
            point = self._measure(trial, "sweep", concurrency)
            trial.points.append(point)
            if point.error or point.errors or point.p99_ms > self.budget_ms:
                break
            flat = 0 if point.throughput > best * (1 + LEVEL_GAIN) else flat + 1
            best = max(best, point.throughput)
            if flat >= 2:
                break
        return trial

    def _score(self, trial: Trial | None) -> float:
        if trial is None:
            return -1.0
        value = frontier.score(trial.points, self.budget_ms)
        return value if value is not None else -1.0

    def best(self) -> Trial | None:
        scored = [t for t in self.trials if self._score(t) >= 0]
        return max(scored, key=self._score, default=None)

    # ---- the whole search ---------------------------------------------------------------------

    def run(self) -> Outcome:
        space = self.space
        shipped = self.trial(space.shipped, "shipped")
        if shipped is None or shipped.load_error:
            reason = shipped.load_error if shipped else "no time to measure it"
            raise TuneError(f"could not measure the shipped configuration: {reason}")
        for candidate in space.first_stage():
            self.trial(candidate, "instances and batching")
        best = self.best()
        if best is not None:
            for candidate in space.larger_batches(best.candidate):
                tried = self.trial(candidate, "max batch size")
                if self._score(tried) < self._score(best) * (1 + MIN_GAIN):
                    break
                best = tried
        for stage, more in (
            ("queue delay", space.queue_delays),
            ("preferred batch sizes", space.preferred_sizes),
        ):
            best = self.best()
            if best is not None:
                for candidate in more(best.candidate):
                    self.trial(candidate, stage)
        return self._decide(shipped)

    def _decide(self, shipped: Trial) -> Outcome:
        best = self.best()
        outcome = Outcome(self.trials, shipped, best, best)
        notes = outcome.notes
        if self.out_of_time:
            notes.append("The time budget ended the sweep before every stage had run.")
        if best is None:
            points = frontier.usable(p for t in self.trials for p in t.points)
            lowest = min(points, default=None, key=lambda p: p.p99_ms)
            seen = f"; the lowest p99 seen was {lowest.p99_ms:.2f} ms" if lowest else ""
            notes.append(f"No configuration kept p99 within {self.budget_ms:g} ms{seen}.")
            return outcome
        if best is shipped:
            outcome.shipped_score = outcome.recommended_score = self._score(shipped)
            notes.append("The shipped configuration was the best one measured.")
            return outcome
        self._side_by_side(shipped, best, outcome)
        won = outcome.recommended_score is not None and (
            outcome.shipped_score is None
            or outcome.recommended_score >= outcome.shipped_score * (1 + MIN_GAIN)
        )
        if not won:
            notes.append(
                f"#{best.id} did best in the sweep but not by {MIN_GAIN:.0%} side by side: "
                "the shipped configuration stays."
            )
            outcome.recommended = shipped
            outcome.recommended_score = outcome.shipped_score
        return outcome

    def _side_by_side(self, shipped: Trial, best: Trial, outcome: Outcome) -> None:
        levels = sorted(
            {
                point.concurrency
                for trial in (shipped, best)
                if (point := frontier.best_within(trial.points, self.budget_ms)) is not None
            }
        )
        self.progress(
            f"side by side: #{shipped.id} (shipped) and #{best.id} at concurrency "
            f"{', '.join(map(str, levels))}"
        )
        for round_number in range(SIDE_BY_SIDE_ROUNDS):
            needed = 2 * self._load_s + 2 * len(levels) * self._point_s + FINISH_S
            if round_number > 0 and self.clock.left() < needed:
                break
            order = (shipped, best) if round_number % 2 == 0 else (best, shipped)
            for trial in order:
                try:
                    self._load(trial.candidate)
                except TuneError as exc:
                    outcome.notes.append(f"#{trial.id} did not reload: {exc}")
                    continue
                for concurrency in levels:
                    trial.side_points.append(self._measure(trial, "side-by-side", concurrency))
            outcome.side_by_side_rounds = round_number + 1
        outcome.shipped_score = frontier.median_score(shipped.side_points, self.budget_ms)
        outcome.recommended_score = frontier.median_score(best.side_points, self.budget_ms)


def trial_summary(trial: Trial, budget_ms: float) -> dict[str, Any]:
    best = frontier.best_within(trial.points, budget_ms)
    return {
        "id": trial.id,
        "label": trial.candidate.label(),
        "stage": trial.stage,
        "candidate": trial.candidate.as_dict(),
        "load_error": trial.load_error,
        "best_throughput": best.throughput if best else None,
        "best_concurrency": best.concurrency if best else None,
        "best_p99_ms": best.p99_ms if best else None,
    }
