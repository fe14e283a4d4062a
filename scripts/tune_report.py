"""Render an `oceanus tune` report again from the measurements.json of a run (how the sample in
docs/tune-sample is regenerated when the report's layout changes, without measuring again):

    python scripts/tune_report.py docs/tune-sample [--config MODEL/config.pbtxt]

The shipped config is the model's config.pbtxt (default: the built-in example of that name).
Writes report.html in the folder; the measurements and config.pbtxt are left as they are."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.tune import output, report
from oceanus.tune.measure import Measurement
from oceanus.tune.space import Candidate
from oceanus.tune.sweep import Outcome, Trial


def outcome_of(document: dict) -> Outcome:
    trials = []
    for item in document["configurations"]:
        candidate = item["candidate"]
        trials.append(
            Trial(
                item["id"],
                Candidate(
                    candidate["instances"],
                    candidate["max_batch_size"],
                    candidate["dynamic_batching"],
                    tuple(candidate["preferred_batch_size"]),
                    candidate["max_queue_delay_microseconds"],
                    candidate["shipped"],
                ),
                item["stage"],
                load_error=item.get("load_error", ""),
            )
        )
    by_id = {t.id: t for t in trials}
    for point in document["measurements"]:
        measurement = Measurement(**point)
        trial = by_id[measurement.config_id]
        (trial.points if measurement.phase == "sweep" else trial.side_points).append(measurement)
    side = document["side_by_side"]
    shipped = next(t for t in trials if t.candidate.shipped)
    recommended = by_id.get(document["recommended"]) if document["recommended"] else None
    budget = document["run"]["budget_ms"]
    scores: dict[int, float | None] = {}
    for trial in trials:  # the sweep's best within the budget, side by side where measured
        best = max((p.throughput for p in trial.points if p.within(budget)), default=None)
        scores[trial.id] = best
    scores.update({int(k): v for k, v in side["throughput"].items()})
    return Outcome(
        trials,
        shipped,
        recommended,
        [by_id[i] for i in side["finalists"]],
        scores,
        side["rounds"],
        document["notes"],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--config", type=Path)
    args = parser.parse_args()
    document = json.loads((args.folder / "measurements.json").read_text())
    run = document["run"]
    info = report.RunInfo(**{**run, "load": tuple(run["load"]) if run.get("load") else None})
    path = args.config
    if path is None:
        from oceanus.examples import example_repository

        path = example_repository((info.model,)) / info.model / "config.pbtxt"
    shipped_text = path.read_text()
    file_config = text_format.Parse(shipped_text, mc.ModelConfig())
    outcome = outcome_of(document)
    text = output.recommended_config(outcome, file_config, shipped_text)
    canonical = shipped_text if text == shipped_text else output.config_text(file_config)
    html = report.render(outcome, info, text or "", canonical)
    (args.folder / "report.html").write_text(html, encoding="utf-8")
    print(f"wrote {args.folder / 'report.html'}")


if __name__ == "__main__":
    main()
