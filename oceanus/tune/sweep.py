"""The search: which configurations to measure, in what order, within the time budget.

1. The shipped config, at concurrency 1, 2, 4, ... until p99 leaves the budget or throughput
   stops growing (two levels without a 5 % gain).
2. Every instance count, with and without dynamic batching.
3. Local search while time is left: the untried neighbours (space.Space.neighbors: batching
   on, twice or half the max batch size, other queue delays, preferred sizes, adjacent instance
   counts) of the best configuration so far, then of the second and third best.
4. Side by side: the shipped config and the two best of the sweep (the finalists), measured in
   rotating rounds at the concurrencies where each did best, so that all see the same machine;
   a finalist replaces the shipped config only if its median wins by at least MIN_GAIN.

Each configuration after the first starts its ladder at a quarter of the best concurrency seen
so far. A fifth of the budget (at least one round) is kept for step 4, and before every
measurement the clock is checked against it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.tune import frontier
from oceanus.tune.measure import Measurement, Meter
from oceanus.tune.progress import Clock, describe
from oceanus.tune.space import Candidate, Space, apply
from oceanus.tune.target import Target, TuneError

# A configuration replaces the shipped one only if it serves this much more, side by side.
MIN_GAIN = 0.02
# A concurrency level counts as a gain when it serves this much more than the best before it.
LEVEL_GAIN = 0.05
# The share of the budget kept for the side-by-side, and its most rounds.
FINAL_SHARE = 0.2
MAX_ROUNDS = 5
# Kept back for stopping the server and writing the report.
FINISH_S = 4.0
# Neighbours of this many of the best configurations are explored.
EXPLORE_TOP = 3


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
    recommended: Trial | None  # None: no configuration within the budget
    finalists: list[Trial] = field(default_factory=list)  # measured side by side
    # throughput within the budget per trial id: side by side (medians), else the sweep's
    scores: dict[int, float | None] = field(default_factory=dict)
    rounds: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def shipped_score(self) -> float | None:
        return self.scores.get(self.shipped.id)

    @property
    def recommended_score(self) -> float | None:
        return self.scores.get(self.recommended.id) if self.recommended else None


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

    def _round_s(self, finalists: int, levels: int) -> float:
        return finalists * (self._load_s + levels * self._point_s)

    def _can_measure(self) -> bool:
        kept = max(FINAL_SHARE * self.clock.total, self._round_s(2, 2)) + FINISH_S
        if self.clock.left() >= kept + self._point_s:
            return True
        self.out_of_time = True
        return False

    # ---- one configuration ------------------------------------------------------------------

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
        shipped = " (shipped)" if candidate.shipped else ""
        self.progress(f"#{trial.id} {candidate.label()}{shipped}")
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

    def score(self, trial: Trial) -> float | None:
        return frontier.score(trial.points, self.budget_ms)

    def ranked(self) -> list[Trial]:
        """Trials with a score, best first."""
        scored = [t for t in self.trials if self.score(t) is not None]
        return sorted(scored, key=lambda t: self.score(t) or 0.0, reverse=True)

    # ---- the whole search ---------------------------------------------------------------------

    def _next(self) -> tuple[str, Candidate] | None:
        tried = {t.candidate.key for t in self.trials}
        for trial in self.ranked()[:EXPLORE_TOP]:
            for stage, candidate in self.space.neighbors(trial.candidate):
                if candidate.key not in tried:
                    return stage, candidate
        return None

    def run(self) -> Outcome:
        shipped = self.trial(self.space.shipped, "shipped")
        if shipped is None or shipped.load_error:
            reason = shipped.load_error if shipped else "no time to measure it"
            raise TuneError(f"could not measure the shipped configuration: {reason}")
        for candidate in self.space.first_stage():
            self.trial(candidate, "instances and batching")
        while not self.out_of_time:
            step = self._next()
            if step is None:
                break
            self.trial(step[1], step[0])
        return self._decide(shipped)

    def _decide(self, shipped: Trial) -> Outcome:
        ranked = self.ranked()
        outcome = Outcome(self.trials, shipped, ranked[0] if ranked else None)
        notes = outcome.notes
        if self.out_of_time:
            notes.append("The time budget ended the search before every neighbour was tried.")
        if not ranked:
            points = frontier.usable(p for t in self.trials for p in t.points)
            lowest = min(points, default=None, key=lambda p: p.p99_ms)
            seen = f"; the lowest p99 seen was {lowest.p99_ms:.2f} ms" if lowest else ""
            notes.append(f"No configuration kept p99 within {self.budget_ms:g} ms{seen}.")
            return outcome
        outcome.scores = {t.id: self.score(t) for t in self.trials}
        if ranked[0] is shipped:
            notes.append("The shipped configuration was the best one measured.")
            return outcome
        finalists = [shipped, *[t for t in ranked if t is not shipped][:2]]
        self._side_by_side(finalists, outcome)
        challengers = [t for t in outcome.finalists if t is not shipped]
        best = max(challengers, key=lambda t: outcome.scores.get(t.id) or 0.0)
        mine, theirs = outcome.scores.get(best.id), outcome.shipped_score
        if mine is not None and (theirs is None or mine >= theirs * (1 + MIN_GAIN)):
            outcome.recommended = best
        else:
            outcome.recommended = shipped
            notes.append(
                f"No configuration beat the shipped one by {MIN_GAIN:.0%} side by side: "
                "the shipped configuration stays."
            )
        return outcome

    def _side_by_side(self, finalists: list[Trial], outcome: Outcome) -> None:
        """Rounds over the finalists (the order rotating), while time is left."""
        levels = sorted(
            {
                best.concurrency
                for trial in finalists
                if (best := frontier.best_within(trial.points, self.budget_ms)) is not None
            }
        )
        if self.clock.left() < self._round_s(len(finalists), len(levels)) + FINISH_S:
            finalists = finalists[:2]
        outcome.finalists = finalists
        names = ", ".join(f"#{t.id}" for t in finalists)
        self.progress(f"side by side: {names} at concurrency {', '.join(map(str, levels))}")
        for number in range(MAX_ROUNDS):
            cost = self._round_s(len(finalists), len(levels))
            if number > 0 and self.clock.left() < cost + FINISH_S:
                break
            shift = number % len(finalists)
            for trial in finalists[shift:] + finalists[:shift]:
                try:
                    self._load(trial.candidate)
                except TuneError as exc:
                    outcome.notes.append(f"#{trial.id} did not reload: {exc}")
                    continue
                for concurrency in levels:
                    trial.side_points.append(self._measure(trial, "side-by-side", concurrency))
            outcome.rounds = number + 1
        for trial in finalists:
            outcome.scores[trial.id] = frontier.median_score(trial.side_points, self.budget_ms)


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
