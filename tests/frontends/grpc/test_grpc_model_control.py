"""RepositoryModelLoad / RepositoryModelUnload over gRPC, in explicit model control mode."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
from grpc_testlib import grpc_error, unary
from tritonclient.grpc import service_pb2 as pb

OVERRIDE = {
    "name": "simple",
    "platform": "onnxruntime_onnx",
    "max_batch_size": 4,
    "input": [
        {"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [16]},
        {"name": "INPUT1", "data_type": "TYPE_INT32", "dims": [16]},
    ],
    "output": [
        {"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [16]},
        {"name": "OUTPUT1", "data_type": "TYPE_INT32", "dims": [16]},
    ],
}


@pytest.fixture
def repo(tmp_path: Path, model_repository: Path) -> Path:
    for name in ("simple", "identity_fp32"):
        shutil.copytree(model_repository / name, tmp_path / name)
    return tmp_path


def add_one(client: grpcclient.InferenceServerClient, model: str) -> np.ndarray:
    tensors = []
    for name, value in (("INPUT0", 5), ("INPUT1", 1)):
        tensor = grpcclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(np.full((1, 16), value, np.int32))
        tensors.append(tensor)
    return client.infer(model, tensors).as_numpy("OUTPUT0")


def test_explicit_load_unload_config_and_files(repo: Path, launch: Any) -> None:
    server = launch(
        [repo], ["--model-control-mode=explicit", "--load-model=simple", "--allow-metrics=false"]
    )
    client = grpcclient.InferenceServerClient(server.grpc_url)
    channel = grpc.insecure_channel(server.grpc_url)
    try:
        index = {m.name: m for m in client.get_model_repository_index().models}
        assert index["simple"].state == "READY"
        assert (index["identity_fp32"].version, index["identity_fp32"].state) == ("", "")
        assert not client.is_model_ready("identity_fp32")

        client.load_model("identity_fp32")
        assert client.is_model_ready("identity_fp32")
        client.unload_model("identity_fp32")
        assert not client.is_model_ready("identity_fp32")
        index = {m.name: m for m in client.get_model_repository_index().models}
        assert (index["identity_fp32"].state, index["identity_fp32"].reason) == (
            "UNAVAILABLE",
            "unloaded",
        )

        # a config override, then a model made only of uploaded files
        client.load_model("simple", config=orjson.dumps(OVERRIDE).decode())
        assert client.get_model_config("simple").config.max_batch_size == 4
        uploaded = orjson.dumps({**OVERRIDE, "name": "uploaded"}).decode()
        onnx_file = (repo / "simple" / "1" / "model.onnx").read_bytes()
        client.load_model("uploaded", config=uploaded, files={"file:1/model.onnx": onnx_file})
        assert (add_one(client, "uploaded") == 6).all()

        # the same failure as over HTTP, with its code mapped once
        status, message = grpc_error(lambda: client.load_model("nonexistent"))
        assert (status, message) == (
            "INVALID_ARGUMENT",
            "failed to load 'nonexistent', failed to poll from model repository",
        )

        # parameters are checked as Triton checks them
        for key, parameter, text in (
            ("config", pb.ModelRepositoryParameter(bool_param=True),
             "invalid value type for load parameter 'config', expected string_param."),
            ("file:1/model.onnx", pb.ModelRepositoryParameter(string_param="x"),
             "invalid value type for load parameter 'file:1/model.onnx', expected bytes_param."),
            ("colour", pb.ModelRepositoryParameter(string_param="blue"),
             "unrecognized load parameter 'colour'."),
        ):  # fmt: skip
            request = pb.RepositoryModelLoadRequest(model_name="simple")
            request.parameters[key].CopyFrom(parameter)
            with pytest.raises(grpc.RpcError) as info:
                unary(channel, "RepositoryModelLoad", request, pb.RepositoryModelLoadResponse)
            assert (info.value.code(), info.value.details()) == (
                grpc.StatusCode.INVALID_ARGUMENT,
                text,
            )
        assert client.is_model_ready("simple")
    finally:
        channel.close()
        client.close()


def test_model_control_off_in_none_mode(grpc_client: grpcclient.InferenceServerClient) -> None:
    for call in (
        lambda: grpc_client.load_model("simple"),
        lambda: grpc_client.unload_model("simple"),
    ):
        assert grpc_error(call) == (
            "UNAVAILABLE",
            "explicit model load / unload is not allowed if polling is enabled",
        )
    assert grpc_client.is_model_ready("simple")
