"""What `oceanus tune` writes under `--output-dir`: the recommended config.pbtxt, report.html,
measurements.csv and measurements.json; and `--apply`, which puts the config in place."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import shutil
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.tune import report
from oceanus.tune.measure import Measurement
from oceanus.tune.space import apply
from oceanus.tune.sweep import Outcome, trial_summary

CSV_COLUMNS = [
    "config_id",
    "label",
    "shipped",
    "instances",
    "max_batch_size",
    "dynamic_batching",
    "preferred_batch_size",
    "max_queue_delay_microseconds",
    *(f.name for f in dataclasses.fields(Measurement) if f.name != "config_id"),
]


def _finite(value: Any) -> Any:
    """JSON has no infinity: a measurement that failed has no latency."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def config_text(config: mc.ModelConfig) -> str:
    return str(text_format.MessageToString(config))


def recommended_config(
    outcome: Outcome, file_config: mc.ModelConfig, shipped_text: str
) -> str | None:
    """The recommended config.pbtxt: the shipped text itself when it stays, otherwise the
    shipped config (as written, not normalized) with the tuned settings."""
    if outcome.recommended is None:
        return None
    if outcome.recommended.candidate.shipped:
        return shipped_text
    return config_text(apply(file_config, outcome.recommended.candidate))


def write_measurements(outcome: Outcome, folder: Path) -> None:
    trials = {t.id: t for t in outcome.trials}
    with open(folder / "measurements.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, CSV_COLUMNS)
        writer.writeheader()
        for trial in outcome.trials:
            for point in trial.points + trial.side_points:
                candidate = trials[point.config_id].candidate
                row = {
                    "label": candidate.label(),
                    **candidate.as_dict(),
                    **point.as_dict(),
                }
                row["preferred_batch_size"] = " ".join(map(str, candidate.preferred))
                writer.writerow({k: row.get(k) for k in CSV_COLUMNS})


def write_json(outcome: Outcome, info: report.RunInfo, folder: Path) -> None:
    recommended = outcome.recommended
    document = {
        "run": dataclasses.asdict(info),
        "recommended": recommended.id if recommended else None,
        "recommended_label": recommended.candidate.label() if recommended else None,
        "side_by_side": {
            "finalists": [t.id for t in outcome.finalists],
            "rounds": outcome.rounds,
            "throughput": {str(t.id): outcome.scores.get(t.id) for t in outcome.finalists},
            "shipped_throughput": outcome.shipped_score,
            "recommended_throughput": outcome.recommended_score,
        },
        "notes": outcome.notes,
        "configurations": [trial_summary(t, info.budget_ms) for t in outcome.trials],
        "measurements": [p.as_dict() for t in outcome.trials for p in t.points + t.side_points],
    }
    text = json.dumps(_finite(document), indent=2, ensure_ascii=False)
    (folder / "measurements.json").write_text(text + "\n", encoding="utf-8")


def write_all(
    outcome: Outcome,
    info: report.RunInfo,
    folder: Path,
    file_config: mc.ModelConfig,
    shipped_text: str,
) -> str | None:
    """Everything under `folder`; returns the recommended config text (None: none)."""
    folder.mkdir(parents=True, exist_ok=True)
    text = recommended_config(outcome, file_config, shipped_text)
    if text is not None:
        (folder / "config.pbtxt").write_text(text, encoding="utf-8")
    else:
        (folder / "config.pbtxt").unlink(missing_ok=True)
    write_measurements(outcome, folder)
    write_json(outcome, info, folder)
    canonical = shipped_text if text == shipped_text else config_text(file_config)
    html = report.render(outcome, info, text or "", canonical)
    (folder / "report.html").write_text(html, encoding="utf-8")
    return text


def apply_config(model_folder: Path, text: str) -> Path:
    """`--apply`: the recommended config replaces the model's config.pbtxt, which is kept as
    config.pbtxt.bak; returns the backup's path."""
    target = model_folder / "config.pbtxt"
    backup = model_folder / "config.pbtxt.bak"
    if target.exists():
        shutil.copy2(target, backup)
    target.write_text(text, encoding="utf-8")
    return backup
