"""Checks that the generated example repository loads, runs and matches its configs."""

from __future__ import annotations

import concurrent.futures
import pathlib
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

from oceanus.examples import (
    EXAMPLE_MODELS,
    GENERATOR_VERSION,
    SMALL_MODELS,
    example_repository,
    write_example_repository,
)
from oceanus.examples.__main__ import main

IDENTITY_SUFFIXES = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "fp16",
    "fp32",
    "fp64",
    "bf16",
    "bytes",
)

# Model-config TYPE_ name -> ONNX element type, for cross-checking configs against graphs.
CONFIG_TO_ONNX = {
    "TYPE_BOOL": TensorProto.BOOL,
    "TYPE_INT8": TensorProto.INT8,
    "TYPE_INT16": TensorProto.INT16,
    "TYPE_INT32": TensorProto.INT32,
    "TYPE_INT64": TensorProto.INT64,
    "TYPE_UINT8": TensorProto.UINT8,
    "TYPE_UINT16": TensorProto.UINT16,
    "TYPE_UINT32": TensorProto.UINT32,
    "TYPE_UINT64": TensorProto.UINT64,
    "TYPE_FP16": TensorProto.FLOAT16,
    "TYPE_FP32": TensorProto.FLOAT,
    "TYPE_FP64": TensorProto.DOUBLE,
    "TYPE_BF16": TensorProto.BFLOAT16,
    "TYPE_STRING": TensorProto.STRING,
}

RESNET_CONFIG = """
name: "resnet50_onnx"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [ { name: "input" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
output [ { name: "output" data_type: TYPE_FP32 dims: [ 1000 ] } ]
dynamic_batching { preferred_batch_size: [ 8, 16, 32, 64 ] max_queue_delay_microseconds: 5000 }
instance_group [ { count: 2 } ]
"""

TEXT_CLASSIFIER_CONFIG = """
name: "text_classifier_onnx"
platform: "onnxruntime_onnx"
max_batch_size: 32
input [ { name: "input_ids" data_type: TYPE_INT64 dims: [ 128 ] },
        { name: "attention_mask" data_type: TYPE_INT64 dims: [ 128 ] } ]
output [ { name: "probabilities" data_type: TYPE_FP32 dims: [ 2 ] } ]
dynamic_batching { preferred_batch_size: [ 4, 8, 16, 32 ] max_queue_delay_microseconds: 2000 }
instance_group [ { count: 2 } ]
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return write_example_repository(tmp_path_factory.mktemp("repo"))


_sessions: dict[pathlib.Path, ort.InferenceSession] = {}


def session(repo: pathlib.Path, name: str) -> ort.InferenceSession:
    path = repo / name / "1" / "model.onnx"
    if path not in _sessions:
        _sessions[path] = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return _sessions[path]


def run(repo: pathlib.Path, name: str, **feeds: np.ndarray) -> list[Any]:
    return list(session(repo, name).run(None, feeds))


def test_model_lists() -> None:
    assert EXAMPLE_MODELS[:2] == ("resnet50_onnx", "text_classifier_onnx")
    assert set(EXAMPLE_MODELS) == {
        "resnet50_onnx",
        "text_classifier_onnx",
        "simple",
        "simple_dyna",
        "slow_fp32",
        "accumulator_onnx",
        *(f"identity_{s}" for s in IDENTITY_SUFFIXES),
    }
    assert set(SMALL_MODELS) == set(EXAMPLE_MODELS) - {"resnet50_onnx", "text_classifier_onnx"}
    assert len(set(EXAMPLE_MODELS)) == len(EXAMPLE_MODELS)


def test_layout_and_onnx_validity(repo: pathlib.Path) -> None:
    assert sorted(p.name for p in repo.iterdir()) == sorted(EXAMPLE_MODELS)
    for name in EXAMPLE_MODELS:
        assert (repo / name / "config.pbtxt").is_file()
        model = onnx.load(str(repo / name / "1" / "model.onnx"))
        onnx.checker.check_model(model, full_check=True)
        # Pinned (not the onnx package's newest) so older onnxruntime releases load it.
        assert model.ir_version == 8
        assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]


@pytest.mark.parametrize("name", EXAMPLE_MODELS)
def test_config_matches_graph(repo: pathlib.Path, name: str) -> None:
    text_format = pytest.importorskip("google.protobuf.text_format")
    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    config = text_format.Parse(
        (repo / name / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    assert config.name == name
    assert config.platform == "onnxruntime_onnx"
    assert config.max_batch_size > 0
    graph = onnx.load(str(repo / name / "1" / "model.onnx"), load_external_data=False).graph
    # Implicit state tensors are model inputs/outputs the config does not list.
    state = {n for s in config.sequence_batching.state for n in (s.input_name, s.output_name)}
    for tensors, all_values in ((config.input, graph.input), (config.output, graph.output)):
        values = [v for v in all_values if v.name not in state]
        assert [t.name for t in tensors] == [v.name for v in values]
        for tensor, value in zip(tensors, values, strict=True):
            type_name = model_config_pb2.DataType.Name(tensor.data_type)
            assert value.type.tensor_type.elem_type == CONFIG_TO_ONNX[type_name]
            dims = value.type.tensor_type.shape.dim
            assert dims[0].dim_param  # symbolic batch dimension
            onnx_dims = [d.dim_value if d.HasField("dim_value") else -1 for d in dims[1:]]
            assert onnx_dims == list(tensor.dims)


@pytest.mark.parametrize(
    ("name", "expected"),
    [("resnet50_onnx", RESNET_CONFIG), ("text_classifier_onnx", TEXT_CLASSIFIER_CONFIG)],
)
def test_large_model_configs_exact(repo: pathlib.Path, name: str, expected: str) -> None:
    text_format = pytest.importorskip("google.protobuf.text_format")
    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    got = text_format.Parse(
        (repo / name / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    assert got == text_format.Parse(expected, model_config_pb2.ModelConfig())


def test_small_model_configs(repo: pathlib.Path) -> None:
    text_format = pytest.importorskip("google.protobuf.text_format")
    pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")

    def load(name: str) -> Any:
        return text_format.Parse((repo / name / "config.pbtxt").read_text(), pb2.ModelConfig())

    simple, dyna = load("simple"), load("simple_dyna")
    assert simple.max_batch_size == dyna.max_batch_size == 8
    assert not simple.HasField("dynamic_batching")
    assert dyna.HasField("dynamic_batching")
    cpu = pb2.ModelInstanceGroup.KIND_CPU
    assert [(g.count, g.kind) for g in simple.instance_group] == [(1, cpu)]
    assert [(g.count, g.kind) for g in dyna.instance_group] == [(2, cpu)]
    slow = load("slow_fp32")
    assert slow.max_batch_size == 64 and not slow.HasField("dynamic_batching")
    for suffix in IDENTITY_SUFFIXES:
        config = load(f"identity_{suffix}")
        assert config.max_batch_size == 8
        assert list(config.input[0].dims) == list(config.output[0].dims) == [-1]
        expected = "TYPE_STRING" if suffix == "bytes" else f"TYPE_{suffix.upper()}"
        assert pb2.DataType.Name(config.input[0].data_type) == expected


@pytest.mark.parametrize("name", ["simple", "simple_dyna"])
def test_simple_add_sub(repo: pathlib.Path, name: str) -> None:
    rng = np.random.default_rng(1)
    a = rng.integers(-(2**20), 2**20, (3, 16), dtype=np.int32)
    b = rng.integers(-(2**20), 2**20, (3, 16), dtype=np.int32)
    out0, out1 = run(repo, name, INPUT0=a, INPUT1=b)
    assert out0.dtype == out1.dtype == np.int32
    np.testing.assert_array_equal(out0, a + b)
    np.testing.assert_array_equal(out1, a - b)


def _random_input(suffix: str, shape: tuple[int, int]) -> np.ndarray:
    rng = np.random.default_rng(2)
    if suffix == "bool":
        return rng.integers(0, 2, shape).astype(np.bool_)
    if suffix == "bytes":
        return np.array(
            [[f"s{i}-é-{j}" for j in range(shape[1])] for i in range(shape[0])], dtype=object
        )
    if suffix in ("fp16", "fp32", "fp64"):
        dtype = {"fp16": np.float16, "fp32": np.float32, "fp64": np.float64}[suffix]
        values = rng.standard_normal(shape).astype(dtype)
        values.flat[:3] = [-0.0, np.inf, np.nan]  # must survive bit for bit too
        return values
    info = np.iinfo(np.dtype(suffix))
    return rng.integers(info.min, info.max, shape, dtype=np.dtype(suffix), endpoint=True)


@pytest.mark.parametrize("suffix", [s for s in IDENTITY_SUFFIXES if s != "bf16"])
def test_identity_returns_input_exactly(repo: pathlib.Path, suffix: str) -> None:
    x = _random_input(suffix, (4, 7))
    (out,) = run(repo, f"identity_{suffix}", INPUT0=x)
    assert out.shape == x.shape and out.dtype == x.dtype
    if suffix == "bytes":
        assert out.tolist() == x.tolist()
    else:
        assert out.tobytes() == x.tobytes()


def test_identity_bf16_runs_on_cpu(repo: pathlib.Path) -> None:
    # numpy has no bfloat16, so feed and fetch the raw 16-bit patterns through OrtValues.
    bits = np.random.default_rng(3).integers(0, 2**16, (4, 7), dtype=np.uint16)
    sess = session(repo, "identity_bf16")
    inp = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, TensorProto.BFLOAT16)
    out_bits = np.zeros_like(bits)
    out = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(out_bits, TensorProto.BFLOAT16)
    binding = sess.io_binding()
    binding.bind_ortvalue_input("INPUT0", inp)
    binding.bind_ortvalue_output("OUTPUT0", out)
    sess.run_with_iobinding(binding)
    assert out.data_type() == "tensor(bfloat16)"
    np.testing.assert_array_equal(out_bits, bits)


@pytest.mark.parametrize("batch", [1, 8, 64])
def test_slow_fp32_returns_input_exactly(repo: pathlib.Path, batch: int) -> None:
    x = np.random.default_rng(4).standard_normal((batch, 16)).astype(np.float32)
    x.flat[:4] = [-0.0, np.inf, -np.inf, np.nan]
    (out,) = run(repo, "slow_fp32", INPUT0=x)
    assert out.shape == (batch, 16) and out.dtype == np.float32
    assert out.tobytes() == x.tobytes()


def test_slow_fp32_keeps_its_heavy_part(repo: pathlib.Path) -> None:
    # Guards against the MatMul chain being constant-folded or dropped by a refactor.
    ops = [n.op_type for n in onnx.load(str(repo / "slow_fp32" / "1" / "model.onnx")).graph.node]
    assert ops.count("MatMul") >= 4


def test_resnet50(repo: pathlib.Path) -> None:
    model = onnx.load(str(repo / "resnet50_onnx" / "1" / "model.onnx"))
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("Conv") == 53  # 1 stem + 16 blocks x 3 + 4 projection shortcuts
    assert ops.count("MaxPool") == 1 and ops.count("Gemm") == 1
    params = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    assert 25_000_000 < params < 26_000_000  # ResNet-50 has ~25.5M parameters

    x = np.random.default_rng(5).standard_normal((2, 3, 224, 224)).astype(np.float32)
    (out,) = run(repo, "resnet50_onnx", input=x)
    assert out.shape == (2, 1000) and out.dtype == np.float32
    assert np.isfinite(out).all()
    assert not np.allclose(out[0], out[1])  # depends on the input
    (single,) = run(repo, "resnet50_onnx", input=x[:1])
    np.testing.assert_allclose(single[0], out[0], rtol=1e-3, atol=1e-3)


def test_text_classifier(repo: pathlib.Path) -> None:
    rng = np.random.default_rng(6)
    ids = rng.integers(0, 8000, (3, 128), dtype=np.int64)
    mask = np.ones((3, 128), dtype=np.int64)
    mask[1, 40:] = 0
    mask[2, 100:] = 0
    (probs,) = run(repo, "text_classifier_onnx", input_ids=ids, attention_mask=mask)
    assert probs.shape == (3, 2) and probs.dtype == np.float32
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    assert ((probs > 0) & (probs < 1)).all()

    # Padding must be invisible: changing the ids under mask == 0 leaves the result alone...
    changed = ids.copy()
    changed[mask == 0] = 1
    (same,) = run(repo, "text_classifier_onnx", input_ids=changed, attention_mask=mask)
    np.testing.assert_allclose(same, probs, rtol=1e-5, atol=1e-6)
    # ...while a visible token does change it.
    changed[0, 5] = (ids[0, 5] + 1) % 8000
    (other,) = run(repo, "text_classifier_onnx", input_ids=changed, attention_mask=mask)
    assert not np.allclose(other[0], probs[0], rtol=0, atol=1e-7)


def test_generation_is_deterministic(tmp_path: pathlib.Path) -> None:
    names = ["text_classifier_onnx", "slow_fp32", "simple"]
    first = write_example_repository(tmp_path / "a", names)
    second = write_example_repository(tmp_path / "b", names)
    for name in names:
        for rel in ("config.pbtxt", "1/model.onnx"):
            assert (first / name / rel).read_bytes() == (second / name / rel).read_bytes()


def test_unknown_model_rejected(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="nope"):
        write_example_repository(tmp_path, ["simple", "nope"])
    assert not (tmp_path / "simple").exists()


def test_example_repository_cache(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OCEANUS_CACHE_DIR", str(tmp_path))
    names = ["identity_fp32", "simple", "identity_bytes"]
    # Many concurrent first uses must agree on one complete directory.
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        paths = set(pool.map(lambda _: example_repository(names), range(8)))
    assert len(paths) == 1
    path = paths.pop()
    assert path.is_relative_to(tmp_path)
    assert f"v{GENERATOR_VERSION}-" in path.name
    assert sorted(p.name for p in path.iterdir()) == sorted(names)
    for name in names:
        assert (path / name / "1" / "model.onnx").is_file()
    # No temporary directories left behind by the losers of the rename race.
    assert [p for p in path.parent.iterdir() if p != path] == []

    # The key is the set of models: order and duplicates do not matter, the set does.
    assert example_repository(reversed(names + names)) == path
    other = example_repository(["simple"])
    assert other != path and sorted(p.name for p in other.iterdir()) == ["simple"]


def test_main_writes_selected_models(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(tmp_path / "out"), "--models", "simple, identity_fp32"]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["identity_fp32", "simple"]
    assert "2 model(s)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "bad"), "--models", "nope"])
    assert exc.value.code == 2
