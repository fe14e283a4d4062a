"""Model warmup (`model_warmup` in config.pbtxt) on a real server, with the Python backend: string
data from a warmup file reaches the model through its worker, and a decoupled model's warmup waits
for every final response. The warmup rules (samples, data, counts, every error text) are tested
in process: tests/core/test_warmup_rules.py."""

from __future__ import annotations

import http.client
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.core.warmup_text import warmup_input, warmup_sample

EXPLICIT = ["--model-control-mode=explicit", "--allow-grpc=false", "--allow-metrics=false"]

# A Python model that answers each request with an error unless INPUT0 holds the expected strings.
CHECKING_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if data.reshape(-1).tolist() != [b"hello", b"warm", b"world"]:
                error = pb_utils.TritonError(f"unexpected warmup data {data.tolist()}")
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data)]))
        return responses
"""

PYTHON_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "INPUT0" data_type: {datatype} dims: [ {dims} ] }} ]
output [ {{ name: "OUTPUT0" data_type: {datatype} dims: [ {dims} ] }} ]
model_warmup [ {warmup} ]
"""


def _python(root: Path, name: str, code: str, datatype: str, dims: str, samples: list[str]) -> Path:
    folder = root / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(code)
    config = PYTHON_CONFIG.format(
        name=name, datatype=datatype, dims=dims, warmup=", ".join(samples)
    )
    (folder / "config.pbtxt").write_text(config)
    return folder


def _request(server: Any, method: str, path: str) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=120)
    connection.request(method, path)
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, orjson.loads(data) if data else None


def _load_error(server: Any, name: str) -> str:
    status, answer = _request(server, "POST", f"/v2/repository/models/{name}/load")
    assert status == 400, answer
    return str(answer["error"])


def test_python_models_get_their_warmup_data_and_decoupled_ones_finish(
    tmp_path: Path, launch: Any
) -> None:
    # BYTES: Triton's length-prefixed serialization, checked by the Python model itself, which
    # gets the warmup requests through the Python backend like any other request.
    words = b"".join(len(w).to_bytes(4, "little") + w for w in (b"hello", b"warm", b"world"))
    text = warmup_sample(
        "text", [warmup_input("INPUT0", 'input_data_file: "words"', "3", "TYPE_STRING")], 3
    )
    for name, data in (("strings", words), ("wrong_strings", words.replace(b"warm", b"cold"))):
        folder = _python(tmp_path, name, CHECKING_MODEL, "TYPE_STRING", "3", [text])
        (folder / "warmup").mkdir()
        (folder / "warmup" / "words").write_bytes(data)
    models = Path(__file__).parents[1] / "backends" / "python" / "models"
    for name, choice in (("repeat_ok", "zero_data: true"), ("repeat_bad", 'input_data_file: "n"')):
        folder = tmp_path / name
        shutil.copytree(models / "repeat", folder, ignore=shutil.ignore_patterns("__pycache__"))
        sample = warmup_sample("decoupled sample", [warmup_input("N", choice, "1")], batch_size=2)
        config = (folder / "config.pbtxt").read_text().replace('"repeat"', f'"{name}"')
        (folder / "config.pbtxt").write_text(config + f"model_warmup [ {sample} ]\n")
        (folder / "warmup").mkdir()
        (folder / "warmup" / "n").write_bytes(np.array([-1], dtype=np.int32).tobytes())
    server = launch([tmp_path], EXPLICIT)
    client = httpclient.InferenceServerClient(server.http_url)
    client.load_model("strings")
    assert client.is_model_ready("strings")
    assert "model 'strings' instance strings_0 is running warmup sample 'text'" in server.log()
    stats = client.get_inference_statistics("strings")["model_stats"][0]
    assert stats["inference_count"] == 0 and stats["execution_count"] == 0
    assert _load_error(server, "wrong_strings") == (
        "failed to load 'wrong_strings': failed to run warmup sample 'text': "
        + "unexpected warmup data [[b'hello', b'cold', b'world']]; " * 3
    )
    with pytest.raises(InferenceServerException, match="unexpected warmup data"):
        client.load_model("wrong_strings")  # tritonclient's call gets the same
    client.load_model("repeat_ok")
    assert client.is_model_ready("repeat_ok")
    assert "is running warmup sample 'decoupled sample'" in server.log()
    assert _load_error(server, "repeat_bad") == (
        "failed to load 'repeat_bad': failed to run warmup sample 'decoupled sample': "
        "negative count; negative count; "
    )
