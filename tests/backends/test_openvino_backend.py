"""The OpenVINO backend through a real server: IRs from the example generator and converted here,
over HTTP and gRPC, batched and not, auto-complete, ONNX files read by OpenVINO, datatypes,
Triton's parameters, load errors naming the tensor, and OpenVINO missing altogether."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ov = pytest.importorskip("openvino")

import ml_dtypes  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from backend_testlib import (  # noqa: E402
    NO_METRICS,
    BlockedServer,
    batch_sizes,
    grpc_infer,
    http_error,
    http_infer,
    index,
    infer_pairs_at_once,
    write_model,
)

from oceanus.examples import small_models  # noqa: E402
from oceanus.examples.repository import write_example_repository  # noqa: E402

SIMPLE_IO = """
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
"""

# Datatypes OpenVINO's CPU plugin carries (INT64 only within 32 bits: the plugin computes it as
# INT32; FP64 as FP32, which an identity keeps exact).
IDENTITY_TYPES = {
    "bool": np.bool_,
    "int8": np.int8,
    "int16": np.int16,
    "int32": np.int32,
    "int64": np.int64,
    "uint8": np.uint8,
    "uint16": np.uint16,
    "uint32": np.uint32,
    "uint64": np.uint64,
    "fp16": np.float16,
    "fp32": np.float32,
    "fp64": np.float64,
    "bf16": ml_dtypes.bfloat16,
}


def _config(name: str, max_batch: int, body: str, extra: str = "") -> str:
    return f'name: "{name}"\nbackend: "openvino"\nmax_batch_size: {max_batch}\n{body}\n{extra}'


def _ir(onnx_model: Any, folder: Path) -> dict[str, Path]:
    """An ONNX example converted to IR (model.xml + model.bin) in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    model = ov.Core().read_model(onnx_model.SerializeToString())
    ov.save_model(model, str(folder / "model.xml"), compress_to_fp16=False)
    return {"model.xml": folder / "model.xml", "model.bin": folder / "model.bin"}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = write_example_repository(tmp_path_factory.mktemp("ov"), ["simple_openvino", "simple"])
    work = tmp_path_factory.mktemp("ir")
    ir = {f: repo / "simple_openvino" / "1" / f for f in ("model.xml", "model.bin")}
    write_model(
        repo,
        "simple_ov_nobatch",
        _config("simple_ov_nobatch", 0, SIMPLE_IO.replace("dims: [ 16 ]", "dims: [ -1, 16 ]")),
        ir,
    )
    # No config: inputs, outputs and batching come from the IR (its layout says "N...").
    write_model(repo, "simple_ov_auto", "", ir)
    # An ONNX file read by OpenVINO.
    write_model(
        repo,
        "simple_ov_onnx",
        _config("simple_ov_onnx", 8, SIMPLE_IO, 'default_model_filename: "model.onnx"'),
        {"model.onnx": repo / "simple" / "1" / "model.onnx"},
    )
    # FP32 in the config for an INT32 model: OpenVINO converts, as in Triton.
    write_model(
        repo,
        "simple_ov_fp32",
        _config("simple_ov_fp32", 8, SIMPLE_IO.replace("TYPE_INT32", "TYPE_FP32")),
        ir,
    )
    write_model(
        repo,
        "simple_ov_throughput",
        _config(
            "simple_ov_throughput",
            8,
            SIMPLE_IO,
            """
parameters { key: "PERFORMANCE_HINT" value: { string_value: "THROUGHPUT" } }
parameters { key: "NUM_STREAMS" value: { string_value: "2" } }
parameters { key: "INFERENCE_NUM_THREADS" value: { string_value: "1" } }
instance_group [ { count: 2 kind: KIND_CPU } ]
""",
        ),
        ir,
    )
    for suffix in IDENTITY_TYPES:
        name = f"identity_ov_{suffix}"
        type_name = f"TYPE_{suffix.upper()}"
        io = (
            f'input [ {{ name: "INPUT0" data_type: {type_name} dims: [ -1 ] }} ]\n'
            f'output [ {{ name: "OUTPUT0" data_type: {type_name} dims: [ -1 ] }} ]'
        )
        files = _ir(small_models.build_identity(suffix), work / name)
        write_model(repo, name, _config(name, 8, io), files)
    # Load errors.
    write_model(
        repo,
        "bad_input_name",
        _config("bad_input_name", 8, SIMPLE_IO.replace('"INPUT1"', '"WRONG"')),
        ir,
    )
    write_model(
        repo,
        "bad_dims",
        _config(
            "bad_dims",
            8,
            SIMPLE_IO.replace(
                'name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ]',
                'name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 8 ]',
            ),
        ),
        ir,
    )
    write_model(
        repo,
        "bad_string",
        _config(
            "bad_string",
            8,
            SIMPLE_IO.replace(
                'name: "INPUT0" data_type: TYPE_INT32', 'name: "INPUT0" data_type: TYPE_STRING'
            ),
        ),
        ir,
    )
    write_model(
        repo,
        "bad_streams",
        _config(
            "bad_streams",
            8,
            SIMPLE_IO,
            'parameters { key: "NUM_STREAMS" value: { string_value: "lots" } }',
        ),
        ir,
    )
    write_model(
        repo,
        "bad_input_count",
        _config(
            "bad_input_count",
            8,
            """
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]
""",
        ),
        ir,
    )
    write_model(repo, "bad_ir", _config("bad_ir", 8, SIMPLE_IO), {"model.xml": b"<net>nope"})
    return repo


@pytest.fixture(scope="module")
def server(repository: Path, launch_module: Any) -> Any:
    return launch_module([repository], ["--exit-on-error=false", *NO_METRICS])


def _pair(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.integers(-(2**20), 2**20, (rows, 16), dtype=np.int32)
    b = rng.integers(-(2**20), 2**20, (rows, 16), dtype=np.int32)
    return a, b


@pytest.mark.parametrize(
    "model", ["simple_openvino", "simple_ov_onnx", "simple_ov_auto", "simple_ov_throughput"]
)
def test_add_sub_http_and_grpc(server: Any, model: str) -> None:
    a, b = _pair(3)
    for infer in (http_infer, grpc_infer):
        url = server.http_url if infer is http_infer else server.grpc_url
        result = infer(url, model, {"INPUT0": a, "INPUT1": b})
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_unbatched(server: Any) -> None:
    a, b = _pair(5, seed=1)
    result = http_infer(server.http_url, "simple_ov_nobatch", {"INPUT0": a, "INPUT1": b})
    assert result.as_numpy("OUTPUT0").shape == (5, 16)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_autocomplete_from_the_ir(server: Any) -> None:
    config = httpclient.InferenceServerClient(server.http_url).get_model_config("simple_ov_auto")
    assert config["backend"] == "openvino"
    assert config["max_batch_size"] == 4  # Triton's default-max-batch-size
    assert "dynamic_batching" in config
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("INPUT0", "TYPE_INT32", [16]),
        ("INPUT1", "TYPE_INT32", [16]),
    ]
    assert [t["name"] for t in config["output"]] == ["OUTPUT0", "OUTPUT1"]
    assert config["default_model_filename"] == "model.xml"


def test_config_datatype_is_converted(server: Any) -> None:
    a = np.full((2, 16), 1.0, np.float32)
    b = np.full((2, 16), 2.0, np.float32)
    result = http_infer(server.http_url, "simple_ov_fp32", {"INPUT0": a, "INPUT1": b})
    assert result.as_numpy("OUTPUT0").dtype == np.float32
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


def test_concurrent_requests_are_correct(server: Any) -> None:
    pairs = [_pair(1 + i % 3, seed=10 + i) for i in range(12)]

    results = infer_pairs_at_once(
        server.http_url, ["simple_ov_throughput", "simple_openvino"], ("INPUT0", "INPUT1"), pairs
    )
    for (a, b), result in zip(pairs, results, strict=True):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize("suffix", list(IDENTITY_TYPES))
def test_datatypes_round_trip(server: Any, suffix: str) -> None:
    rng = np.random.default_rng(4)
    dtype = np.dtype(IDENTITY_TYPES[suffix])
    value: np.ndarray
    if suffix == "bool":
        value = rng.integers(0, 2, (2, 5)).astype(np.bool_)
    elif suffix == "int64":  # OpenVINO's CPU plugin keeps 32 bits of INT64
        value = rng.integers(-(2**31), 2**31 - 1, (2, 5), dtype=np.int64)
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        value = rng.integers(info.min, info.max, (2, 5), dtype=dtype, endpoint=True)
    else:
        value = rng.standard_normal((2, 5)).astype(np.float32).astype(dtype)
        value.flat[:3] = [-0.0, np.inf, np.nan]
    datatype = "BF16" if suffix == "bf16" else ""
    result = http_infer(
        server.http_url,
        f"identity_ov_{suffix}",
        {"INPUT0": value},
        {"INPUT0": datatype} if datatype else None,
    )
    out = result.as_numpy("OUTPUT0")
    assert out.shape == value.shape
    assert out.astype(value.dtype).tobytes() == value.tobytes()


def test_wrong_shapes_and_types_are_400(server: Any) -> None:
    a, b = _pair(1)
    error = http_error(server.http_url, "simple_openvino", {"INPUT0": a[:, :8], "INPUT1": b[:, :8]})
    assert error.status() == "400"
    # both inputs are bad: Triton names the first in its hash map's order (docs section 16)
    assert "unexpected shape for input 'INPUT1'" in error.message()
    error = http_error(
        server.http_url, "simple_openvino", {"INPUT0": a.astype(np.int64), "INPUT1": b}
    )
    assert error.status() == "400"
    assert "data-type is 'INT64', but model 'simple_openvino' expects 'INT32'" in error.message()


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        (
            "bad_input_name",
            "unexpected inference input 'WRONG', allowed inputs are: 'INPUT0', 'INPUT1'",
        ),
        (
            "bad_dims",
            "model 'bad_dims', tensor 'OUTPUT1': the model expects 2 dimensions (shape "
            "[-1,16]) but the model configuration specifies 2 dimensions",
        ),
        (
            "bad_string",
            "unsupported datatype TYPE_STRING for input 'INPUT0' for model 'bad_string'",
        ),
        (
            "bad_streams",
            "expected the parameter 'NUM_STREAMS' to be either AUTO/NUMA/<int_value>, got lots",
        ),
        ("bad_input_count", "configuration expects 1 inputs, model provides 2"),
        ("bad_ir", "OpenVINO cannot read 'model.xml'"),
    ],
)
def test_load_errors_name_what_is_wrong(server: Any, model: str, expected: str) -> None:
    entry = index(server.http_url)[model]
    assert entry["state"] == "UNAVAILABLE"
    assert expected in entry["reason"]


def test_dynamic_batching_forms_batches(repository: Path, launch: Any) -> None:
    server = launch(
        [repository],
        ["--exit-on-error=false", *NO_METRICS, "--allow-grpc=false"],
        env={"TRITONSERVER_DELAY_SCHEDULER": "4"},
    )
    pairs = [_pair(1, seed=20 + i) for i in range(4)]

    results = infer_pairs_at_once(server.http_url, ["simple_openvino"], ("INPUT0", "INPUT1"), pairs)
    for (a, b), result in zip(pairs, results, strict=True):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert batch_sizes(server.http_url, "simple_openvino") == {4: 1}


def test_generated_resnet50_ir_matches_the_onnx_model(tmp_path: Path) -> None:
    """The IR the generator converts computes what the ONNX ResNet-50 computes (in-process)."""
    import onnxruntime as ort

    from oceanus.examples import resnet

    repo = write_example_repository(tmp_path, ["resnet50_openvino"])
    compiled = ov.Core().compile_model(
        str(repo / "resnet50_openvino" / "1" / "model.xml"),
        "CPU",
        {"INFERENCE_PRECISION_HINT": "f32"},  # not bf16 on CPUs that have it
    )
    images = np.random.default_rng(7).random((2, 3, 224, 224), dtype=np.float32)
    got = compiled.create_infer_request().infer({"input": images})[0]
    session = ort.InferenceSession(
        resnet.build().SerializeToString(), providers=["CPUExecutionProvider"]
    )
    (expected,) = session.run(None, {"input": images})
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-3)


def test_missing_openvino_is_reported_clearly(repository: Path, tmp_path: Path) -> None:
    server = BlockedServer(
        ["openvino"], [repository], tmp_path, ["--exit-on-error=false", "--allow-grpc=false"]
    )
    try:
        server.wait_live()
        entries = index(server.http_url)
        assert entries["simple_openvino"]["state"] == "UNAVAILABLE"
        assert (
            "backend 'openvino' needs OpenVINO: pip install oceanus[openvino]"
            in entries["simple_openvino"]["reason"]
        )
        assert entries["simple"]["state"] == "READY"
    finally:
        server.stop()
