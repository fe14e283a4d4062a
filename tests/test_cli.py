"""The command line: tritonserver's flags, bad flags, exit-on-error both ways."""

from __future__ import annotations

import http.client
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from oceanus.cli import parse_args


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "oceanus", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    "args, words",
    [
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--http-port=abc"], "invalid port 'abc'"),
        (["--exit-on-error=maybe"], "invalid boolean value 'maybe'"),
        (["--model-control-mode=sometimes"], "invalid choice: 'sometimes'"),
    ],
)
def test_bad_flags_exit_2_with_one_clear_line(
    args: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The parser `python -m oceanus` runs (its process: test_help_lists_triton_flag_names)."""
    with pytest.raises(SystemExit) as exited:
        parse_args(args)
    assert exited.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert words in lines[0]


def test_help_lists_triton_flag_names() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    for flag in (
        "--model-repository",
        "--http-port",
        "--grpc-port",
        "--metrics-port",
        "--exit-on-error",
        "--strict-readiness",
        "--disable-auto-complete-config",
        "--log-verbose",
        "--http-max-input-size",
    ):
        assert flag in result.stdout


def test_busy_poll_budget_flag() -> None:
    assert parse_args([])[0].http_busy_poll_us == 200
    assert parse_args(["--http-busy-poll-us=0"])[0].http_busy_poll_us == 0
    result = run_cli("--http-busy-poll-us=-5")
    assert result.returncode == 2
    assert "--http-busy-poll-us" in result.stderr


def test_missing_repository_folder_fails() -> None:
    result = run_cli("--model-repository=/nonexistent/models", "--http-port=0")
    assert result.returncode == 1


@pytest.fixture
def broken_repository(tmp_path: Path, model_repository: Path) -> Path:
    shutil.copytree(model_repository / "simple", tmp_path / "simple")
    broken = tmp_path / "broken"
    (broken / "1").mkdir(parents=True)
    shutil.copy(model_repository / "simple" / "1" / "model.onnx", broken / "1" / "model.onnx")
    (broken / "config.pbtxt").write_text(
        'name: "broken"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\ninput [ { name: }\n'
    )
    wrong_type = tmp_path / "wrong_type"
    shutil.copytree(model_repository / "simple", wrong_type)
    config = (wrong_type / "config.pbtxt").read_text()
    (wrong_type / "config.pbtxt").write_text(
        config.replace('"simple"', '"wrong_type"').replace("TYPE_INT32", "TYPE_FP32", 1)
    )
    return tmp_path


def test_exit_on_error_true_names_the_model_and_reason(broken_repository: Path) -> None:
    result = run_cli(
        f"--model-repository={broken_repository}",
        "--http-port=0",
        "--grpc-port=0",
        "--metrics-port=0",
        "--allow-grpc=false",
        "--allow-metrics=false",
    )
    assert result.returncode == 1
    # each failure once, in full, in its own line (the table cuts long reasons)
    assert result.stderr.count("failed to load 'broken'") == 1
    assert "4:" in result.stderr  # the parse error names its line
    assert "wrong_type" in result.stderr
    assert "configuration expects datatype TYPE_FP32 for input 'INPUT0'" in result.stderr


def get(server: Any, method: str, path: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    connection.request(method, path)
    response = connection.getresponse()
    return response.status, response.read()


def test_exit_on_error_false_serves_the_good_models(broken_repository: Path, launch: Any) -> None:
    server = launch([broken_repository], ["--exit-on-error=false"])
    assert get(server, "GET", "/v2/models/simple/ready")[0] == 200
    assert get(server, "GET", "/v2/models/broken/ready")[0] == 400
    # strict readiness: a model that failed makes the server not ready
    assert get(server, "GET", "/v2/health/ready")[0] == 400
    _, body = get(server, "POST", "/v2/repository/index")
    index = {entry["name"]: entry for entry in orjson.loads(body)}
    assert index["simple"]["state"] == "READY"
    assert index["broken"]["state"] == "UNAVAILABLE"
    assert "failed to parse" in index["broken"]["reason"]
    assert index["wrong_type"]["state"] == "UNAVAILABLE"
    assert "TYPE_FP32" in index["wrong_type"]["reason"]
    # the model table is in the log
    assert "| simple" in server.log()


def test_strict_readiness_false_ignores_failed_models(broken_repository: Path, launch: Any) -> None:
    server = launch([broken_repository], ["--exit-on-error=false", "--strict-readiness=false"])
    assert get(server, "GET", "/v2/health/ready")[0] == 200


def test_log_verbose_shows_each_request_path_and_sigterm_stops_cleanly(
    model_repository: Path, launch: Any
) -> None:
    import numpy as np
    import tritonclient.http as httpclient

    server = launch([model_repository], ["--log-verbose=1", "--allow-grpc=false"])
    client = httpclient.InferenceServerClient(server.http_url)
    data = np.ones((1, 16), dtype=np.int32)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    client.infer("simple_dyna", inputs, request_id="traced-1")
    log = server.log()
    assert "HTTP infer request 'traced-1' for 'simple_dyna' received" in log
    assert "request 'traced-1' for 'simple_dyna' queued" in log
    assert "batch of 1 request(s), 1 row(s) formed for 'simple_dyna' on instance" in log
    assert "executed a batch of 1 for 'simple_dyna'" in log
    assert "HTTP infer responded" in log
    # ONNX Runtime's tiny `simple` is cheap enough for the event loop (core/scheduling/instance.py;
    # the rules themselves: tests/core/test_instances.py): after its first two batches on the
    # instance thread, lone requests execute in place. Wall time decides, so only "some".
    for _ in range(30):
        client.infer("simple", inputs)
    lines = server.log().splitlines()
    simple = [line for line in lines if "executed a batch of 1 for 'simple' in" in line]
    assert len(simple) == 30
    assert "on the event loop" not in simple[0] + simple[1]
    assert sum("on the event loop" in line for line in simple) >= 5
    assert any("for 'simple' executes in place" in line for line in lines)
    assert server.stop() == 0
    assert "Started HTTPService at 127.0.0.1" in server.log()
