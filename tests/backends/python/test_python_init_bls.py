"""A BLS request from initialize() fails the load with Triton's text (Triton 2.51 refuses BLS
outside execute: its stub checks that initialize() returned and finalize() has not begun)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.backends.python.conftest import copy_models

MODEL_PY = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        ones = np.ones((1, 4), dtype=np.float32)
        request = pb_utils.InferenceRequest(
            model_name="add_sub",
            inputs=[pb_utils.Tensor("INPUT0", ones * 3), pb_utils.Tensor("INPUT1", ones)],
            requested_output_names=["OUTPUT0"],
        )
        response = request.exec()
        if response.has_error():
            raise pb_utils.TritonModelException(response.error().message())
        self.sum = pb_utils.get_output_tensor_by_name(response, "OUTPUT0").as_numpy()

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("SUM", self.sum)]) for _ in requests]
"""
CONFIG = """backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 1, 4 ] } ]
"""


def test_bls_from_initialize_is_refused(launch: Any, tmp_path: Path) -> None:
    repository = copy_models(tmp_path / "models", ["add_sub"])
    (repository / "init_bls" / "1").mkdir(parents=True)
    (repository / "init_bls" / "1" / "model.py").write_text(MODEL_PY)
    (repository / "init_bls" / "config.pbtxt").write_text(CONFIG)
    server = launch([repository], ["--model-control-mode=explicit", "--load-model=add_sub"])
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    with pytest.raises(InferenceServerException) as failed:
        client.load_model("init_bls")  # its initialize() asks add_sub for 3 + 1
    text = str(failed.value.message())
    assert "TritonModelException: BLS is only supported during the 'execute' function." in text
    assert "/init_bls/1/model.py(13): initialize" in text
    assert client.is_model_ready("add_sub")  # the server keeps serving
