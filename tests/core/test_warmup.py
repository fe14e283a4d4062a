"""Model warmup (`model_warmup` in config.pbtxt): samples run on every instance before READY."""

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

EXPLICIT = ["--model-control-mode=explicit", "--allow-grpc=false", "--allow-metrics=false"]

SIMPLE_CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }},
  {{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }}
]
output [
  {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }},
  {{ name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }}
]
instance_group [ {{ count: 2 kind: KIND_CPU }} ]
model_warmup [ {warmup} ]
"""

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

FAILING_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                output_tensors=[], error=pb_utils.TritonError("An Error Occurred")
            )
            for _ in requests
        ]
"""

PYTHON_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "INPUT0" data_type: {datatype} dims: [ {dims} ] }} ]
output [ {{ name: "OUTPUT0" data_type: {datatype} dims: [ {dims} ] }} ]
model_warmup [ {warmup} ]
"""


def _input(name: str, choice: str, dims: str = "16", datatype: str = "TYPE_INT32") -> str:
    return (
        f'inputs {{ key: "{name}" value: {{ data_type: {datatype} dims: [ {dims} ] {choice} }} }}'
    )


def _sample(name: str, inputs: list[str], batch_size: int = 1, count: int = 0) -> str:
    text = f'{{ name: "{name}" batch_size: {batch_size} ' + " ".join(inputs)
    return text + (f" count: {count} }}" if count else " }")


def _simple(root: Path, model_repository: Path, name: str, samples: list[str]) -> Path:
    folder = root / name
    shutil.copytree(model_repository / "simple" / "1", folder / "1")
    warmup = ", ".join(samples)
    (folder / "config.pbtxt").write_text(SIMPLE_CONFIG.format(name=name, warmup=warmup))
    return folder


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


def _reason(server: Any, name: str) -> str:
    status, entries = _request(server, "POST", "/v2/repository/index")
    assert status == 200
    (entry,) = [e for e in entries if e["name"] == name]
    assert entry["state"] == "UNAVAILABLE"
    return str(entry["reason"])


def test_zero_and_random_samples_run_on_every_instance_and_are_not_counted(
    tmp_path: Path, model_repository: Path, launch: Any
) -> None:
    _simple(
        tmp_path,
        model_repository,
        "warm",
        [
            _sample(
                "zeros", [_input("INPUT0", "zero_data: true"), _input("INPUT1", "zero_data: 1")]
            ),
            _sample(
                "random",
                [_input("INPUT0", "random_data: true"), _input("INPUT1", "random_data: true")],
                batch_size=8,
                count=2,
            ),
        ],
    )
    server = launch([tmp_path], ["--allow-grpc=false", "--allow-metrics=false"])
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.is_model_ready("warm")

    log = server.log()
    for instance in ("warm_0_0", "warm_0_1"):
        prefix = f"model 'warm' instance {instance} is running warmup sample"
        assert f"{prefix} 'zeros' for iteration 1" in log
        assert f"{prefix} 'zeros' for iteration 2" not in log
        assert f"{prefix} 'random' for iteration 1" in log
        assert f"{prefix} 'random' for iteration 2" in log
    assert "failed to run warmup" not in log

    stats = client.get_inference_statistics("warm")["model_stats"][0]
    assert stats["inference_count"] == 0
    assert stats["execution_count"] == 0
    assert stats["inference_stats"]["success"]["count"] == 0

    data = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    result = client.infer("warm", inputs)
    assert np.array_equal(result.as_numpy("OUTPUT0"), data * 2)
    stats = client.get_inference_statistics("warm")["model_stats"][0]
    assert stats["inference_count"] == 1
    assert stats["execution_count"] == 1


def test_input_data_files(tmp_path: Path, model_repository: Path, launch: Any) -> None:
    # A fixed-size input read from <model>/warmup/<file> (raw bytes, row-major).
    folder = _simple(
        tmp_path,
        model_repository,
        "from_file",
        [
            _sample(
                "file",
                [_input("INPUT0", 'input_data_file: "in0"'), _input("INPUT1", "zero_data: true")],
                batch_size=2,
            )
        ],
    )
    (folder / "warmup").mkdir()
    (folder / "warmup" / "in0").write_bytes(np.arange(16, dtype=np.int32).tobytes())
    # BYTES: Triton's length-prefixed serialization, checked by the Python model itself, which
    # gets the warmup requests through the Python backend like any other request.
    strings = _python(
        tmp_path,
        "strings",
        CHECKING_MODEL,
        "TYPE_STRING",
        "3",
        [_sample("text", [_input("INPUT0", 'input_data_file: "words"', "3", "TYPE_STRING")], 3)],
    )
    (strings / "warmup").mkdir()
    words = b"".join(len(w).to_bytes(4, "little") + w for w in (b"hello", b"warm", b"world"))
    (strings / "warmup" / "words").write_bytes(words)
    # The same model with other strings fails its warmup: the data really reaches the model.
    wrong = _python(
        tmp_path,
        "wrong_strings",
        CHECKING_MODEL,
        "TYPE_STRING",
        "3",
        [_sample("text", [_input("INPUT0", 'input_data_file: "words"', "3", "TYPE_STRING")])],
    )
    (wrong / "warmup").mkdir()
    (wrong / "warmup" / "words").write_bytes(words.replace(b"warm", b"cold"))
    short = _simple(
        tmp_path,
        model_repository,
        "short_file",
        [
            _sample(
                "short",
                [_input("INPUT0", 'input_data_file: "in0"'), _input("INPUT1", "zero_data: 1")],
            )
        ],
    )
    (short / "warmup").mkdir()
    (short / "warmup" / "in0").write_bytes(b"\0" * 60)

    server = launch([tmp_path], EXPLICIT)
    client = httpclient.InferenceServerClient(server.http_url)
    client.load_model("from_file")
    client.load_model("strings")
    assert client.is_model_ready("from_file") and client.is_model_ready("strings")
    assert "model 'strings' instance strings_0 is running warmup sample 'text'" in server.log()
    stats = client.get_inference_statistics("strings")["model_stats"][0]
    assert stats["inference_count"] == 0 and stats["execution_count"] == 0

    error = _load_error(server, "wrong_strings")
    assert error == (
        "failed to load 'wrong_strings': failed to run warmup sample 'text': unexpected warmup "
        "data [[b'hello', b'cold', b'world']]; "
    )
    assert _load_error(server, "short_file") == (
        "failed to load 'short_file': warmup sample 'short': warmup setting expects 64 bytes, "
        "but the data provided from in0only has 60 bytes"
    )


def test_failing_sample_fails_the_load(tmp_path: Path, model_repository: Path, launch: Any) -> None:
    zero = _sample("zero sample", [_input("INPUT", "zero_data: true", "4", "TYPE_FP32")])
    folder = _python(tmp_path, "failing_infer", FAILING_MODEL, "TYPE_FP32", "4", [zero])
    (folder / "config.pbtxt").write_text(
        (folder / "config.pbtxt").read_text().replace('"INPUT0"', '"INPUT"')
    )
    _simple(
        tmp_path,
        model_repository,
        "wrong_dims",
        [
            _sample(
                "dims", [_input("INPUT0", "zero_data: true", "8"), _input("INPUT1", "zero_data: 1")]
            )
        ],
    )
    server = launch([tmp_path], EXPLICIT)

    expected = "failed to run warmup sample 'zero sample': An Error Occurred; "
    assert _load_error(server, "failing_infer") == f"failed to load 'failing_infer': {expected}"
    assert _reason(server, "failing_infer") == expected
    assert expected in server.log()
    with pytest.raises(InferenceServerException, match="An Error Occurred"):
        httpclient.InferenceServerClient(server.http_url).load_model("failing_infer")

    error = _load_error(server, "wrong_dims")
    assert error.startswith(
        "failed to load 'wrong_dims': warmup sample 'dims': [request id: <id_unknown>] "
        "unexpected shape for input 'INPUT0' for model 'wrong_dims'. Expected [-1,16], got [1,8]."
    )
    assert _reason(server, "wrong_dims") == error[len("failed to load 'wrong_dims': ") :]


@pytest.mark.parametrize(
    ("sample", "message"),
    [
        (
            _sample("no data", [_input("INPUT0", ""), _input("INPUT1", "zero_data: true")]),
            "warmup sample 'no data': warmup setting expects input 'INPUT0' to have "
            "input_data_type set",
        ),
        (
            _sample("unknown", [_input("INPUT0", "zero_data: 1"), _input("BOGUS", "zero_data: 1")]),
            "warmup sample 'unknown': unexpected inference input 'BOGUS' for model 'bad'",
        ),
        (
            _sample("variable", [_input("INPUT0", "zero_data: 1", "-1"), _input("INPUT1", "")]),
            "warmup sample 'variable': warmup setting expects all variable-size dimensions are "
            "specified for input 'INPUT0'",
        ),
        (
            _sample("missing", [_input("INPUT0", "zero_data: 1")]),
            "warmup sample 'missing': [request id: <id_unknown>] expected 2 inputs but got 1 "
            "inputs for model 'bad'. Got input(s) ['INPUT0'], but missing required input(s) "
            "['INPUT1']. Please provide all required input(s).",
        ),
        (
            # Both inputs: Triton counts them before it looks at their types.
            _sample(
                "type",
                [
                    _input("INPUT0", "zero_data: 1", datatype="TYPE_FP32"),
                    _input("INPUT1", "zero_data: 1"),
                ],
            ),
            "warmup sample 'type': [request id: <id_unknown>] inference input 'INPUT0' data-type "
            "is 'FP32', but model 'bad' expects 'INT32'",
        ),
        (
            _sample("both", [_input("INPUT0", "zero_data: true random_data: true")]),
            'Field "random_data" is specified along with field "zero_data", another member of '
            'oneof "input_data_type"',
        ),
        (
            _sample("no file", [_input("INPUT0", 'input_data_file: "nope"')]),
            "warmup sample 'no file': failed to open text file for read",
        ),
    ],
)
def test_bad_warmup_config_fails_the_load(
    sample: str, message: str, tmp_path: Path, model_repository: Path, launch: Any
) -> None:
    _simple(tmp_path, model_repository, "bad", [sample])
    server = launch([tmp_path], EXPLICIT)
    error = _load_error(server, "bad")
    assert message in error
    assert message in _reason(server, "bad")
    assert "is running warmup sample" not in server.log()


def test_decoupled_python_model_waits_for_final_responses(tmp_path: Path, launch: Any) -> None:
    models = Path(__file__).parents[1] / "backends" / "python" / "models"
    for name, choice in (("repeat_ok", "zero_data: true"), ("repeat_bad", 'input_data_file: "n"')):
        folder = tmp_path / name
        shutil.copytree(models / "repeat", folder, ignore=shutil.ignore_patterns("__pycache__"))
        sample = _sample("decoupled sample", [_input("N", choice, "1")], batch_size=2)
        config = (folder / "config.pbtxt").read_text().replace('"repeat"', f'"{name}"')
        (folder / "config.pbtxt").write_text(config + f"model_warmup [ {sample} ]\n")
        (folder / "warmup").mkdir()
        (folder / "warmup" / "n").write_bytes(np.array([-1], dtype=np.int32).tobytes())
    server = launch([tmp_path], EXPLICIT)
    client = httpclient.InferenceServerClient(server.http_url)
    client.load_model("repeat_ok")
    assert client.is_model_ready("repeat_ok")
    assert "is running warmup sample 'decoupled sample'" in server.log()
    assert _load_error(server, "repeat_bad") == (
        "failed to load 'repeat_bad': failed to run warmup sample 'decoupled sample': "
        "negative count; negative count; "
    )
