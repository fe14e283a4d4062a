"""A newcomer's first start (issue 19): a taken port or a missing repository is one line naming
the flag, exit code 1, before any model loads; each load failure is logged once, in full, with
a hint for the usual mistakes, and the model table fits 100 columns."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from oceanus import startup
from oceanus.logs import table
from oceanus.settings import Settings
from tests.conftest import free_port


def oceanus(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "oceanus", "--frontend-workers=0", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def error_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("E")]


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


@pytest.mark.parametrize("flag", ["--http-port", "--grpc-port", "--metrics-port"])
def test_taken_port_is_one_line_before_any_model_loads(
    model_repository: Path, taken_port: int, flag: str
) -> None:
    ports = {"--http-port": free_port(), "--grpc-port": free_port(), "--metrics-port": free_port()}
    ports[flag] = taken_port
    result = oceanus(
        f"--model-repository={model_repository}", *(f"{k}={v}" for k, v in ports.items())
    )
    assert result.returncode == 1, result.stderr
    [line] = error_lines(result)
    assert f"{flag} {taken_port} is already in use" in line
    assert "loaded" not in result.stderr  # nothing was loaded first
    assert "Traceback" not in result.stderr


def test_only_enabled_services_with_fixed_ports_are_checked(taken_port: int) -> None:
    settings = Settings(
        allow_metrics=False, metrics_port=taken_port, grpc_port=0, http_port=free_port()
    )
    assert [listener.flag for listener in startup.listeners(settings)] == ["--http-port"]
    assert startup.check_ports(settings) is None


def test_two_services_on_one_port(model_repository: Path) -> None:
    port = free_port()
    result = oceanus(
        f"--model-repository={model_repository}",
        f"--http-port={port}",
        f"--grpc-port={port}",
        f"--metrics-port={free_port()}",
    )
    assert result.returncode == 1
    [line] = error_lines(result)
    assert f"--http-port and --grpc-port are both {port}" in line


def test_missing_repository(tmp_path: Path) -> None:
    missing = tmp_path / "nothing-here"
    result = oceanus(f"--model-repository={missing}")
    assert result.returncode == 1
    [line] = error_lines(result)
    assert line.endswith(
        f"failed to stat file {missing}: --model-repository {missing} does not exist"
    )


def _bad_repository(root: Path, model_repository: Path) -> Path:
    """Three first-repository mistakes beside a model that loads."""
    simple = model_repository / "simple"
    shutil.copytree(simple, root / "simple")
    # the model file beside config.pbtxt, no version folder
    (root / "flat").mkdir()
    shutil.copy(simple / "1" / "model.onnx", root / "flat" / "model.onnx")
    # dims that do not match the model file's [16] (same rank: "2 dimensions ... 2 dimensions")
    shutil.copytree(simple, root / "wrong_dims")
    config = (simple / "config.pbtxt").read_text()
    (root / "wrong_dims" / "config.pbtxt").write_text(
        config.replace('"simple"', '"wrong_dims"').replace("dims: [ 16 ]", "dims: [ 8 ]")
    )
    # a backend Oceanus does not have
    (root / "tf" / "1").mkdir(parents=True)
    (root / "tf" / "1" / "model.savedmodel").mkdir()
    (root / "tf" / "config.pbtxt").write_text(
        'name: "tf"\nplatform: "tensorflow_savedmodel"\nmax_batch_size: 0\n'
    )
    return root


def test_load_errors_once_each_with_a_hint(tmp_path: Path, model_repository: Path) -> None:
    repository = _bad_repository(tmp_path / "repo", model_repository)
    result = oceanus(
        f"--model-repository={repository}",
        f"--http-port={free_port()}",
        f"--grpc-port={free_port()}",
        f"--metrics-port={free_port()}",
    )
    assert result.returncode == 1
    log = result.stderr
    for model in ("flat", "wrong_dims", "tf"):
        [line] = [x for x in error_lines(result) if f"'{model}'" in x]
        assert f"failed to load '{model}'" in line
        assert "(hint: " in line
    [flat] = [x for x in error_lines(result) if "'flat'" in x]
    assert "expected a numbered folder such as 'flat/1/'" in flat
    assert "move model.onnx from 'flat/' into 'flat/1/'" in flat
    [dims] = [x for x in error_lines(result) if "'wrong_dims'" in x]
    assert "the model file's shape is [-1,16], the config's dims give [-1,8]" in dims
    assert "write dims: [ 16 ]" in dims
    [tf] = [x for x in error_lines(result) if "'tf'" in x]
    known = tf.split("known backends: ", 1)[1].split(")", 1)[0].split(", ")
    assert {"onnxruntime", "python", "vllm"} <= set(known) and known == sorted(known)
    assert "known platforms: onnxruntime_onnx" in tf
    # The table: every model, no line wider than 100 columns, long reasons cut with "...".
    table = [line for line in log.splitlines() if line.startswith(("|", "+"))]
    assert table and max(len(line) for line in table) <= 100
    assert any("| simple " in line and "READY" in line for line in table)
    assert any("| wrong_dims " in line and line.rstrip(" |").endswith("...") for line in table)
    assert error_lines(result)[-1].endswith(
        "exiting: failed to load all models (--exit-on-error=true)"
    )


def test_table_cuts_the_widest_column_to_fit() -> None:
    rows = [["simple", "1", "READY"], ["broken", "-", "UNAVAILABLE: " + "x" * 200 + "\nAt: y"]]
    lines = table(["Model", "Version", "Status"], rows, max_width=60).splitlines()
    assert {len(line) for line in lines} == {60}
    assert lines[4].endswith("xxx... |")
    # Without a width the table is Triton's: cells as they are.
    assert table(["A"], [["ab"]]) == "+----+\n| A  |\n+----+\n| ab |\n+----+"
