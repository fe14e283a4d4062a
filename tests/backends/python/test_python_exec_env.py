"""EXECUTION_ENV_PATH: a model's own Python environment, as an archive or a folder.

The environment is made offline by the test: a venv with the server's packages visible
(`--system-site-packages`, so numpy is there) plus a tiny package the server's interpreter does
not have; model.py imports that package, so the model answers only if its stub really runs in
that environment.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.backends.python.conftest import copy_models

PACKAGE = "oceanus_env_only_pkg"  # importable only inside the environment
MODEL_PY = f"""import sys

import {PACKAGE}
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            prefix = [sys.prefix.encode()]
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", x + {PACKAGE}.OFFSET),
                pb_utils.Tensor("PREFIX", __import__("numpy").array(prefix, dtype=object)),
            ]))
        return responses
"""
CONFIG = """backend: "python"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_INT64 dims: [ 2 ] }} ]
output [ {{ name: "Y" data_type: TYPE_INT64 dims: [ 2 ] }},
         {{ name: "PREFIX" data_type: TYPE_STRING dims: [ 1 ] }} ]
parameters {{ key: "EXECUTION_ENV_PATH" value {{ string_value: "{path}" }} }}
"""


def make_venv(folder: Path, system_site_packages: bool) -> Path:
    args = [sys.executable, "-m", "venv", "--without-pip", str(folder)]
    if system_site_packages:
        args.insert(4, "--system-site-packages")
    subprocess.run(args, check=True)
    site = next(folder.glob("lib/python3*/site-packages"))
    (site / PACKAGE).mkdir()
    (site / PACKAGE / "__init__.py").write_text("OFFSET = 41\n")
    return folder


def add_model(repository: Path, name: str, env_path: str) -> Path:
    folder = repository / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(MODEL_PY)
    (folder / "config.pbtxt").write_text(CONFIG.format(path=env_path))
    return folder


@pytest.fixture(scope="module")
def env_server(launch_module: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("exec-env")
    env = make_venv(root / "env", system_site_packages=True)
    repository = copy_models(root / "models", ["add_sub"])
    packed = add_model(repository, "packed", "$$TRITON_MODEL_DIRECTORY/env.tar.gz")
    # conda-pack's fixer, run once after unpacking: here it leaves a mark in the unpacked copy.
    unpack = root / "conda-unpack"
    unpack.write_text(
        "import pathlib, sys\n"
        "pathlib.Path(sys.argv[0]).resolve().parent.parent.joinpath('unpack-ran').touch()\n"
    )
    with tarfile.open(packed / "env.tar.gz", "w:gz") as archive:
        archive.add(env, arcname=".")
        archive.add(unpack, arcname="./bin/conda-unpack")
    add_model(repository, "folder", str(env))
    add_model(repository, "missing", "$$TRITON_MODEL_DIRECTORY/missing.tar.gz")
    broken = add_model(repository, "broken", "$$TRITON_MODEL_DIRECTORY/env.tar.gz")
    (broken / "env.tar.gz").write_bytes(b"\x1f\x8b\x08\x00 this is not an archive")
    bare = make_venv(root / "bare", system_site_packages=False)  # no numpy
    add_model(repository, "no_numpy", str(bare))
    cache = root / "cache"
    server = launch_module(
        [repository],
        ["--model-control-mode=explicit", "--load-model=*", "--exit-on-error=false"],
        {"OCEANUS_PYTHON_ENV_CACHE": str(cache)},
    )
    server.root, server.repository, server.cache = root, repository, cache
    return server


def infer(client: httpclient.InferenceServerClient, model: str) -> tuple[Any, str]:
    x = httpclient.InferInput("X", [2], "INT64")
    x.set_data_from_numpy(np.array([1, 2], dtype=np.int64))
    result = client.infer(model, [x])
    return result.as_numpy("Y"), result.as_numpy("PREFIX")[0].decode()


def index(server: Any) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/repository/index", data=b"{}", method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return {entry["name"]: entry for entry in json.loads(response.read())}


def test_packed_environment_runs_the_model(env_server: Any) -> None:
    client = httpclient.InferenceServerClient(env_server.http_url, network_timeout=60)
    y, prefix = infer(client, "packed")
    assert y.tolist() == [42, 43]
    unpacked = [p for p in env_server.cache.iterdir() if not p.name.startswith(".")]
    assert [p.name.startswith("env-") for p in unpacked] == [True]
    assert Path(prefix).resolve() == unpacked[0].resolve()  # the stub ran on its interpreter
    assert (unpacked[0] / "unpack-ran").exists()


def test_folder_environment_runs_the_model(env_server: Any) -> None:
    client = httpclient.InferenceServerClient(env_server.http_url, network_timeout=60)
    y, prefix = infer(client, "folder")
    assert y.tolist() == [42, 43]
    assert Path(prefix).resolve() == (env_server.root / "env").resolve()


def test_archive_is_unpacked_once_across_loads(env_server: Any) -> None:
    client = httpclient.InferenceServerClient(env_server.http_url, network_timeout=60)
    before = {p.name: p.stat().st_ino for p in env_server.cache.iterdir()}
    client.unload_model("packed")
    client.load_model("packed")
    assert {p.name: p.stat().st_ino for p in env_server.cache.iterdir()} == before
    assert infer(client, "packed")[0].tolist() == [42, 43]


@pytest.mark.parametrize(
    ("model", "path", "what"),
    [
        ("missing", "{repo}/missing/missing.tar.gz", "does not exist"),
        ("broken", "{repo}/broken/env.tar.gz", "is not a readable archive: "),
        ("no_numpy", "{root}/bare", "No module named 'numpy'"),
    ],
)
def test_bad_environment_is_a_load_error(env_server: Any, model: str, path: str, what: str) -> None:
    entry = index(env_server)[model]
    assert entry["state"] == "UNAVAILABLE"
    full = path.format(repo=env_server.repository, root=env_server.root)
    assert f"model '{model}': EXECUTION_ENV_PATH '{full}' " in entry["reason"]
    assert what in entry["reason"]
    client = httpclient.InferenceServerClient(env_server.http_url, network_timeout=60)
    with pytest.raises(InferenceServerException, match=f"EXECUTION_ENV_PATH '{full}'"):
        client.load_model(model)
    assert client.is_model_ready("add_sub")  # the server keeps serving the others
