"""A backend from another package: tests/backends/third_party/oceanus-echo-backend is installed
with pip into a temporary folder (never into this environment), a real server started with that
folder on its PYTHONPATH finds it through the `oceanus.backends` entry point, and serves a model
of it over HTTP. Unknown backend names are errors that list the known ones."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from oceanus.core.backend_registry import BackendRegistry
from oceanus.core.errors import InferenceServerError

PACKAGE = Path(__file__).parent / "third_party" / "oceanus-echo-backend"

ECHO_CONFIG = """
name: "echo_model"
backend: "echo"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 3 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 3 ] } ]
"""

UNKNOWN_CONFIG = """
name: "nope_model"
backend: "nope"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def install_package(into: Path) -> Path:
    """pip-install the echo backend into `into`/site, offline and without its dependencies
    (oceanus is already here). Built from a copy: setuptools writes build/ and *.egg-info
    beside the sources."""
    source = into / "src"
    shutil.copytree(PACKAGE, source)
    site = into / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    options = ["--no-deps", "--no-build-isolation", "--no-index", "--target", str(site)]
    done = subprocess.run([*pip, *options, str(source)], capture_output=True, text=True)
    assert done.returncode == 0, f"pip could not install the echo backend:\n{done.stderr}"
    return site


def write_model(repository: Path, name: str, config: str, model_file: str) -> None:
    version = repository / name / "1"
    version.mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(config)
    (version / model_file).write_text("")


@pytest.fixture(scope="module")
def echo_server(tmp_path_factory: pytest.TempPathFactory, launch_module: Any) -> Any:
    site = install_package(tmp_path_factory.mktemp("echo-backend"))
    repository = tmp_path_factory.mktemp("echo-repository")
    write_model(repository, "echo_model", ECHO_CONFIG, "model.echo")
    write_model(repository, "nope_model", UNKNOWN_CONFIG, "model.nope")
    python_path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    return launch_module(
        [repository],
        ["--exit-on-error=false", "--allow-metrics=false"],
        env={"PYTHONPATH": python_path},
    )


def test_package_is_not_installed_here() -> None:
    """The test must prove the entry point works, not find a copy installed by hand."""
    import importlib.metadata

    names = [entry.name for entry in importlib.metadata.entry_points(group="oceanus.backends")]
    assert "echo" not in names


def test_server_serves_a_model_of_the_installed_backend(echo_server: Any) -> None:
    client = httpclient.InferenceServerClient(echo_server.http_url)
    assert client.is_model_ready("echo_model")
    assert client.get_model_config("echo_model")["backend"] == "echo"
    first = np.arange(8, dtype=np.float32).reshape(2, 4) - 2.5
    second = np.array([[1, -2, 3], [40, 50, -60]], dtype=np.int32)
    inputs = [
        httpclient.InferInput("INPUT0", [2, 4], "FP32"),
        httpclient.InferInput("INPUT1", [2, 3], "INT32"),
    ]
    inputs[0].set_data_from_numpy(first)
    inputs[1].set_data_from_numpy(second, binary_data=False)
    result = client.infer("echo_model", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), first * 2)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), second * 2)
    assert result.as_numpy("OUTPUT1").dtype == np.int32


def test_unknown_backend_fails_its_model_naming_the_known_ones(echo_server: Any) -> None:
    client = httpclient.InferenceServerClient(echo_server.http_url)
    entries = {entry["name"]: entry for entry in client.get_model_repository_index()}
    assert entries["nope_model"]["state"] == "UNAVAILABLE"
    reason = entries["nope_model"]["reason"]
    assert "unable to find backend 'nope'" in reason
    # The installed backend is listed beside the built-in ones.
    assert "known backends: echo, oceanus_llm, onnxruntime" in reason
    assert entries["echo_model"]["state"] == "READY"


def test_registry_error_lists_known_backends() -> None:
    with pytest.raises(InferenceServerError, match="known backends: none"):
        BackendRegistry().get("nope")
    from oceanus.backends import builtin

    with pytest.raises(InferenceServerError) as caught:
        builtin.registry(entry_points=False).get("nope", model="m")
    assert str(caught.value).startswith("unable to load model 'm': unable to find backend 'nope'")
    known = "oceanus_llm, onnxruntime, openvino, python, pytorch, tensorrt, vllm"
    assert f"known backends: {known}" in str(caught.value)
