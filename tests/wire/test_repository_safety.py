"""The repository API cannot be turned against the server's file system, and a runtime's
complaint about a request's values is the client's mistake (issue 18).

- model names that are not folder names ('.', '..', slashes, over-long) are refused with a 400
  before anything is written, over HTTP and gRPC, and no temporary folder is left behind;
- `default_model_filename` resolves inside the version folder: '..' and absolute paths are
  refused alike, whether or not the file they name exists (no probing);
- ONNX Runtime's INVALID_ARGUMENT (token ids outside an embedding) is a 400 with its words.
"""

from __future__ import annotations

import base64
import http.client
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

SIMPLE_CONFIG = {
    "platform": "onnxruntime_onnx",
    "max_batch_size": 8,
    "input": [
        {"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [16]},
        {"name": "INPUT1", "data_type": "TYPE_INT32", "dims": [16]},
    ],
    "output": [
        {"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [16]},
        {"name": "OUTPUT1", "data_type": "TYPE_INT32", "dims": [16]},
    ],
}


def post(server: Any, path: str, document: Any) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    connection.request("POST", path, body=orjson.dumps(document))
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, orjson.loads(data) if data else None


@pytest.fixture(scope="module")
def spool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The server's TMPDIR: where uploaded model folders are written."""
    return tmp_path_factory.mktemp("spool")


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory,
    model_repository: Path,
    spool: Path,
    launch_module: Any,
) -> Any:
    repo = tmp_path_factory.mktemp("repo")
    shutil.copytree(model_repository / "simple", repo / "simple")
    return launch_module(
        [repo],
        ["--model-control-mode=explicit", "--load-model=simple", "--allow-metrics=false"],
        {"TMPDIR": str(spool)},
    )


@pytest.mark.parametrize("name", [".", "..", "a/b", "../escape", "x" * 300])
def test_names_that_are_not_folder_names_are_refused(
    server: Any, spool: Path, model_repository: Path, name: str
) -> None:
    onnx_file = (model_repository / "simple" / "1" / "model.onnx").read_bytes()
    config = orjson.dumps({"name": name, **SIMPLE_CONFIG}).decode()
    parameters = {"config": config, "file:1/model.onnx": base64.b64encode(onnx_file).decode()}
    status, answer = post(server, f"/v2/repository/models/{name}/load", {"parameters": parameters})
    if name in ("a/b", "../escape"):  # never even routed: a path has no such segment
        assert status in (400, 404)
    else:
        assert status == 400, answer
        assert "invalid model name" in answer["error"]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as error:
        client.load_model(name, config=config, files={"file:1/model.onnx": onnx_file})
    assert "StatusCode.INVALID_ARGUMENT" in str(error.value.status())
    assert "invalid model name" in str(error.value.message())
    assert list(spool.glob("oceanus-load-*")) == []  # nothing written, nothing left behind


@pytest.mark.parametrize("filename", ["../../../../etc/passwd", "/etc/passwd", "/no/such/file"])
def test_default_model_filename_stays_in_the_version_folder(
    server: Any, model_repository: Path, filename: str
) -> None:
    onnx_file = (model_repository / "simple" / "1" / "model.onnx").read_bytes()
    config = {"name": "escaping", **SIMPLE_CONFIG, "default_model_filename": filename}
    client = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException) as error:
        client.load_model(
            "escaping", config=orjson.dumps(config).decode(), files={"file:1/model.onnx": onnx_file}
        )
    # Whether the file exists or not, the same words: nothing can be learned about the host.
    assert "must name a file inside the version folder" in str(error.value.message())
    # The client's mistake: 400 / INVALID_ARGUMENT (it was 503, the server's fault).
    assert error.value.status() == "400"
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as grpc_error:
        grpc.load_model(
            "escaping", config=orjson.dumps(config).decode(), files={"file:1/model.onnx": onnx_file}
        )
    assert "StatusCode.INVALID_ARGUMENT" in str(grpc_error.value.status())
    assert "must name a file inside the version folder" in str(grpc_error.value.message())


def _gather_model(path: Path) -> None:
    """IDS [-1, 4] INT64 -> EMBEDDED: rows of a 10-row table (ids past 9 are invalid)."""
    table = helper.make_tensor(
        "table", TensorProto.FLOAT, [10, 2], np.arange(20, dtype=np.float32).tolist()
    )
    node = helper.make_node("Gather", ["table", "IDS"], ["EMBEDDED"], axis=0)
    graph = helper.make_graph(
        [node],
        "gather",
        [helper.make_tensor_value_info("IDS", TensorProto.INT64, [None, 4])],
        [helper.make_tensor_value_info("EMBEDDED", TensorProto.FLOAT, [None, 4, 2])],
        initializer=[table],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.parent.mkdir(parents=True)
    onnx.save(model, str(path))


def test_a_runtimes_invalid_argument_is_the_clients_mistake(tmp_path: Path, launch: Any) -> None:
    _gather_model(tmp_path / "embed" / "1" / "model.onnx")
    (tmp_path / "embed" / "config.pbtxt").write_text('name: "embed"\nmax_batch_size: 4\n')
    server = launch([tmp_path], ["--allow-metrics=false"])
    client = httpclient.InferenceServerClient(server.http_url)
    ids = httpclient.InferInput("IDS", [1, 4], "INT64")
    ids.set_data_from_numpy(np.array([[1, 2, 3, 99]], dtype=np.int64))
    with pytest.raises(InferenceServerException) as error:
        client.infer("embed", [ids])
    assert error.value.status() == "400"
    assert "onnx runtime error 2" in str(error.value.message())
    assert "indices element out of data bounds" in str(error.value.message())
    ids.set_data_from_numpy(np.array([[1, 2, 3, 4]], dtype=np.int64))
    assert client.infer("embed", [ids]).as_numpy("EMBEDDED")[0, 3].tolist() == [8.0, 9.0]
