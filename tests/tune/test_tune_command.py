"""`oceanus tune` end to end on `simple`, with short time budgets: it starts its own server (or
uses a running one), writes the report, CSV, JSON and a config.pbtxt that a server loads, and
its recommendation is at least as fast as the shipped config in its own side-by-side run."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http as httpclient

from oceanus.tune.perf_analyzer import version

PA_BINARY = Path(os.environ.get("PA_VENV", "/tmp/pa-venv")) / "bin" / "perf_analyzer"


def tune(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "oceanus", "tune", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def perf_analyzer_runs() -> bool:
    if not PA_BINARY.exists():
        return False
    try:
        version(PA_BINARY)
        return True
    except RuntimeError:
        return False


def infer_simple(url: str) -> None:
    client = httpclient.InferenceServerClient(url)
    data = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    result = client.infer("simple", inputs)
    assert (result.as_numpy("OUTPUT0") == data * 2).all()
    client.close()


def check_outputs(folder: Path, budget_minutes: float, min_configs: int = 1) -> dict[str, Any]:
    document = json.loads((folder / "measurements.json").read_text())
    run = document["run"]
    # bounded by --max-minutes (a generous margin: one measurement may overrun on a busy CI box)
    assert run["elapsed_s"] <= budget_minutes * 60 * 2
    assert document["recommended"] is not None
    side = document["side_by_side"]
    # at least as fast as the shipped config, side by side (which may miss the budget at all)
    shipped, chosen = side["shipped_throughput"], side["recommended_throughput"]
    assert chosen > 0 and (shipped is None or chosen >= shipped)
    configurations = document["configurations"]
    assert configurations[0]["candidate"]["shipped"] is True
    assert len(configurations) >= min_configs
    with open(folder / "measurements.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == len(document["measurements"]) > 0
    assert {row["phase"] for row in rows} >= {"sweep"}
    html = (folder / "report.html").read_text()
    assert html.count("<svg") >= 2 and "p99 budget" in html and "Top configurations" in html
    assert "https://" not in html
    return document


def load_in_a_copy(tmp_path: Path, model_repository: Path, config: str, launch: Any) -> Any:
    """A repository holding `simple` with `config` as its config.pbtxt, served."""
    repository = tmp_path / "applied"
    shutil.copytree(model_repository / "simple", repository / "simple")
    (repository / "simple" / "config.pbtxt").write_text(config)
    return launch([repository], ["--frontend-workers=0"])


def test_tune_starts_its_server_and_writes_a_config_that_loads(
    model_repository: Path, tmp_path: Path, launch: Any
) -> None:
    out = tmp_path / "out"
    result = tune(
        "simple",
        f"--model-repository={model_repository}",
        "--max-minutes=0.5",
        "--load-generator=built-in",
        f"--output-dir={out}",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "#1 1 instance, max batch 8, no dynamic batching (shipped)" in result.stderr
    assert "infer/s" in result.stderr and "recommended:" in result.stdout
    document = check_outputs(out, 0.5, min_configs=2)  # it went past the shipped config
    assert document["run"]["generator"] == "built-in"
    assert (out / "server.log").exists()
    # the recommended config loads and serves
    config = (out / "config.pbtxt").read_text()
    server = load_in_a_copy(tmp_path, model_repository, config, launch)
    infer_simple(server.http_url)
    client = httpclient.InferenceServerClient(server.http_url)
    loaded = client.get_model_config("simple")
    chosen = next(
        c["candidate"] for c in document["configurations"] if c["id"] == document["recommended"]
    )
    assert loaded["max_batch_size"] == chosen["max_batch_size"]
    assert sum(g["count"] for g in loaded["instance_group"]) == chosen["instances"]
    assert ("dynamic_batching" in loaded) == chosen["dynamic_batching"]
    client.close()


def test_tune_a_running_server_and_apply(
    model_repository: Path, tmp_path: Path, launch: Any
) -> None:
    repository = tmp_path / "repo"
    shutil.copytree(model_repository / "simple", repository / "simple")
    original = (repository / "simple" / "config.pbtxt").read_text()
    server = launch([repository], ["--model-control-mode=explicit", "--load-model=simple"])
    out = tmp_path / "out"
    generator = (
        ["--load-generator=perf_analyzer", f"--perf-analyzer={PA_BINARY}"]
        if perf_analyzer_runs()
        else ["--load-generator=built-in"]
    )
    result = tune(
        "simple",
        f"--url={server.http_url}",
        f"--model-repository={repository}",
        "--max-minutes=0.35",
        "--apply",
        f"--output-dir={out}",
        *generator,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    check_outputs(out, 0.35)
    recommended = (out / "config.pbtxt").read_text()
    assert (repository / "simple" / "config.pbtxt").read_text() == recommended
    assert (repository / "simple" / "config.pbtxt.bak").read_text() == original
    client = httpclient.InferenceServerClient(server.http_url)
    # tune left the running server with the repository's config as it found it ...
    assert sum(g["count"] for g in client.get_model_config("simple")["instance_group"]) == 1
    # ... and the applied one loads
    client.load_model("simple")
    infer_simple(server.http_url)
    client.close()


def test_tune_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    result = tune("no_such_model", "--max-minutes=1")
    assert result.returncode == 1
    assert "'no_such_model' is not a built-in example model" in result.stderr
    result = tune("simple", "--apply", "--max-minutes=1")
    assert result.returncode == 1 and "--apply needs --model-repository" in result.stderr
    result = tune("simple", "--max-minutes=0.1")
    assert result.returncode == 2 and "--max-minutes must allow" in result.stderr
    result = tune("--max-minutes=1")
    assert result.returncode == 2 and "MODEL" in result.stderr
    result = tune("simple", "--url=127.0.0.1:1", f"--output-dir={tmp_path}")
    assert result.returncode == 1 and "cannot reach the server" in result.stderr
