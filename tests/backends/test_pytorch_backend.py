"""The PyTorch backend through a real server: TorchScript models from the example generator and
models built here, over HTTP and gRPC, batched and not, every datatype torch holds, Triton's
naming conventions, load errors naming the tensor, and PyTorch missing altogether."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("torch")

import torch

sys.path.insert(0, str(Path(__file__).parent))
from backend_testlib import (
    NO_METRICS,
    BlockedServer,
    batch_sizes,
    grpc_infer,
    http_error,
    http_infer,
    index,
    infer_pairs_at_once,
)
from pytorch_repository import IDENTITY_TYPES, Upper, script, write_pytorch_repository

# TorchScript is deprecated in recent PyTorch (it warns on script, save and load); still served.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_pytorch_repository(tmp_path_factory.mktemp("pt"))


@pytest.fixture(scope="module")
def server(repository: Path, launch_module: Any) -> Any:
    return launch_module([repository], ["--exit-on-error=false", *NO_METRICS])


def _pair(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.integers(-(2**20), 2**20, (rows, 16), dtype=np.int32)
    b = rng.integers(-(2**20), 2**20, (rows, 16), dtype=np.int32)
    return a, b


def test_generated_simple_pytorch_http_and_grpc(server: Any) -> None:
    a, b = _pair(3)
    result = http_infer(server.http_url, "simple_pytorch", {"INPUT__0": a, "INPUT__1": b})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), a - b)
    result = grpc_infer(server.grpc_url, "simple_pytorch", {"INPUT__0": a, "INPUT__1": b})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), a - b)


def test_onnx_pytorch_and_openvino_side_by_side(server: Any) -> None:
    """The same add/sub model served by each framework in one server answers the same."""
    a, b = _pair(2, seed=5)
    models = {
        "simple": ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1"),
        "simple_pytorch": ("INPUT__0", "INPUT__1", "OUTPUT__0", "OUTPUT__1"),
    }
    if "simple_openvino" in index(server.http_url):
        models["simple_openvino"] = ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1")
    for model, (in0, in1, out0, out1) in models.items():
        result = http_infer(server.http_url, model, {in0: a, in1: b})
        np.testing.assert_array_equal(result.as_numpy(out0), a + b)
        np.testing.assert_array_equal(result.as_numpy(out1), a - b)


def test_generated_resnet_small_matches_torch(server: Any, repository: Path) -> None:
    images = np.random.default_rng(6).random((2, 3, 224, 224), dtype=np.float32)
    result = http_infer(server.http_url, "resnet_small_pytorch", {"INPUT__0": images})
    scores = result.as_numpy("OUTPUT__0")
    assert scores.shape == (2, 1000)
    module = torch.jit.load(str(repository / "resnet_small_pytorch" / "1" / "model.pt"))
    with torch.inference_mode():
        expected = module(torch.from_numpy(images)).numpy()
    np.testing.assert_allclose(scores, expected, rtol=1e-4, atol=1e-4)
    assert not np.allclose(scores[0], scores[1])  # depends on the input


def test_unbatched(server: Any) -> None:
    a, b = _pair(5, seed=1)
    result = http_infer(server.http_url, "simple_pytorch_nobatch", {"INPUT__0": a, "INPUT__1": b})
    assert result.as_numpy("OUTPUT__0").shape == (5, 16)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), a - b)


def test_concurrent_requests_are_correct(server: Any) -> None:
    pairs = [_pair(1 + i % 3, seed=10 + i) for i in range(12)]

    results = infer_pairs_at_once(
        server.http_url, ["simple_pytorch"], ("INPUT__0", "INPUT__1"), pairs
    )
    for (a, b), result in zip(pairs, results, strict=True):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), a - b)


@pytest.mark.parametrize("datatype", list(IDENTITY_TYPES))
def test_every_datatype_round_trips(server: Any, datatype: str) -> None:
    dtype = np.dtype(IDENTITY_TYPES[datatype])
    rng = np.random.default_rng(3)
    if datatype == "BF16":
        dtype = np.dtype(np.float32)
    if dtype == np.bool_:
        value = rng.integers(0, 2, (2, 5)).astype(np.bool_)
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        value = rng.integers(info.min, info.max, (2, 5), dtype=dtype, endpoint=True)
    else:
        value = rng.standard_normal((2, 5)).astype(dtype)
        value.flat[:3] = [-0.0, np.inf, np.nan]
    if datatype == "BF16":
        value = value.astype(ml_dtypes.bfloat16)
    name = f"identity_pt_{datatype.lower()}"
    result = http_infer(server.http_url, name, {"INPUT__0": value}, {"INPUT__0": datatype})
    out = result.as_numpy("OUTPUT__0")
    assert out.shape == value.shape
    assert out.astype(value.dtype).tobytes() == value.tobytes()


def test_inputs_by_forward_argument_name_and_list_output(server: Any) -> None:
    a = np.array([[5, 6, 7]], dtype=np.float32)
    b = np.array([[1, 2, 3]], dtype=np.float32)
    result = http_infer(server.http_url, "by_argument_name", {"a": a, "b": b})
    np.testing.assert_array_equal(result.as_numpy("DIFF__0"), a - b)
    np.testing.assert_array_equal(result.as_numpy("DOUBLE__1"), a * 2)


def test_dict_input(server: Any) -> None:
    x = np.array([3, 4], dtype=np.float32)
    y = np.array([0.5, 2], dtype=np.float32)
    result = http_infer(server.http_url, "dict_input", {"x": x, "y": y})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), x * y)


def test_strings_are_lists_of_str(server: Any) -> None:
    words = ["abc", "\u00e9t\u00e9", ""]
    text = np.array([w.encode() for w in words], dtype=object)
    result = http_infer(server.http_url, "strings", {"INPUT__0": text}, {"INPUT__0": "BYTES"})
    upper, lengths = script(Upper)(words)  # the same model in this process
    assert result.as_numpy("OUTPUT__0").tolist() == [w.encode() for w in upper]
    assert result.as_numpy("OUTPUT__1").tolist() == lengths.tolist()
    error = http_error(
        server.http_url,
        "strings",
        {"INPUT__0": np.array([b"\xff"], dtype=object)},
        {"INPUT__0": "BYTES"},
    )
    assert error.status() == "400"
    assert "not valid UTF-8" in error.message()


def test_wrong_shapes_and_types_are_400(server: Any) -> None:
    a, b = _pair(1)
    error = http_error(
        server.http_url, "simple_pytorch", {"INPUT__0": a[:, :8], "INPUT__1": b[:, :8]}
    )
    assert error.status() == "400"
    # both inputs are bad: Triton names the first in its hash map's order (docs section 16)
    assert "unexpected shape for input 'INPUT__1'" in error.message()
    error = http_error(
        server.http_url, "simple_pytorch", {"INPUT__0": a.astype(np.float32), "INPUT__1": b}
    )
    assert error.status() == "400"
    assert "data-type is 'FP32', but model 'simple_pytorch' expects 'INT32'" in error.message()
    error = http_error(
        server.http_url,
        "simple_pytorch",
        {"INPUT__0": np.zeros((9, 16), np.int32), "INPUT__1": np.zeros((9, 16), np.int32)},
    )
    assert error.status() == "400"
    assert "batch-size must be <= 8" in error.message()


def test_output_datatype_mismatch_is_reported_when_run(server: Any) -> None:
    a, b = _pair(1)
    error = http_error(server.http_url, "wrong_output_type", {"INPUT__0": a, "INPUT__1": b})
    assert error.status() == "400"
    assert (
        "configuration expects datatype TYPE_FP32 for output 'OUTPUT__1', model provides "
        "TYPE_INT32" in error.message()
    )


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        (
            "bad_no_inputs",
            "model configuration must contain at least one input, none were specified",
        ),
        ("bad_autocomplete", "model configuration must contain at least one input"),
        (
            "bad_output_index",
            "output 'OUTPUT__5' refers to output index 5, but forward() returns 2 output(s)",
        ),
        ("bad_input_count", "configuration expects 3 inputs, model provides 2"),
        ("bad_string_tensor", "input 'INPUT__1' is TYPE_STRING but forward() takes a Tensor"),
        ("bad_file", "'model.pt' is not a TorchScript model"),
        ("bad_parameter", "parameter 'INFERENCE_MODE' value 'maybe'"),
    ],
)
def test_load_errors_name_what_is_wrong(server: Any, model: str, expected: str) -> None:
    entry = index(server.http_url)[model]
    assert entry["state"] == "UNAVAILABLE"
    assert expected in entry["reason"]


def test_auto_completed_platform_is_pytorch(server: Any) -> None:
    """A folder with model.pt and no config is recognized as a PyTorch model (whose config must
    then list its tensors)."""
    reason = index(server.http_url)["bad_autocomplete"]["reason"]
    assert "TorchScript file does not record its input names" in reason


def test_dynamic_batching_forms_batches(repository: Path, launch: Any) -> None:
    server = launch(
        [repository],
        ["--exit-on-error=false", *NO_METRICS, "--allow-grpc=false"],
        env={"TRITONSERVER_DELAY_SCHEDULER": "4"},
    )
    pairs = [_pair(1, seed=20 + i) for i in range(4)]

    results = infer_pairs_at_once(
        server.http_url, ["simple_pytorch"], ("INPUT__0", "INPUT__1"), pairs
    )
    for (a, b), result in zip(pairs, results, strict=True):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), a + b)
    assert batch_sizes(server.http_url, "simple_pytorch") == {4: 1}


def test_missing_pytorch_is_reported_clearly(repository: Path, tmp_path: Path) -> None:
    """The server runs with `torch` unimportable: PyTorch models fail to load, saying which extra
    to install; the ONNX model beside them serves."""
    server = BlockedServer(
        ["torch"], [repository], tmp_path, ["--exit-on-error=false", "--allow-grpc=false"]
    )
    try:
        server.wait_live()
        entries = index(server.http_url)
        reason = entries["simple_pytorch"]["reason"]
        assert entries["simple_pytorch"]["state"] == "UNAVAILABLE"
        assert "backend 'pytorch' needs PyTorch: pip install oceanus[pytorch]" in reason
        assert entries["simple"]["state"] == "READY"
        assert "needs PyTorch: pip install oceanus[pytorch]" in server.log()
    finally:
        server.stop()


@pytest.mark.skipif(
    "ATen parallel backend: OpenMP" not in torch.__config__.parallel_info(),
    reason="per-thread intra-op sizes need PyTorch's OpenMP build",
)
def test_each_instance_thread_keeps_its_own_thread_count(repository: Path) -> None:
    """Instances share the cores: each sizes the OpenMP team of its own execution thread, and a
    later instance does not resize an earlier one's (in-process, on the real backend)."""
    import threading

    from oceanus.backends import builtin
    from oceanus.core.backend import BatchInstance, InstanceSpec, LoadContext, ModelFiles
    from oceanus.core.repository import model_config

    folder = repository / "simple_pytorch"
    config = model_config.read_config_file(folder / "config.pbtxt")
    backend = builtin.registry(entry_points=False).get("pytorch")
    path = backend.model_path(config, folder / "1")
    backend.complete_config(config, path, True)
    model_config.normalize(config)
    wanted = (1, 2, 1)
    files = ModelFiles(folder, folder / "1", path)
    instances: list[BatchInstance] = []
    for n, threads in enumerate(wanted):
        instance = backend.load(
            LoadContext(config, files, InstanceSpec(f"i_{n}", "CPU", 0, threads))
        )
        assert isinstance(instance, BatchInstance)
        instances.append(instance)
    seen: dict[int, int] = {}
    ready = threading.Barrier(len(instances))

    def run(n: int) -> None:
        a = np.ones((1, 16), np.int32)
        instances[n].execute({"INPUT__0": a, "INPUT__1": a})
        ready.wait()  # every instance has configured its thread
        out = instances[n].execute({"INPUT__0": a, "INPUT__1": a})
        assert out["OUTPUT__0"].tolist() == [[2] * 16]
        seen[n] = torch.get_num_threads()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(instances))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == dict(enumerate(wanted))
