"""PyTorch 2 packages (`model.pt2`, Triton's `torch_aoti` platform) through a real server: a
torch.export ExportedProgram and an AOTInductor package built here from our own modules (nothing
is downloaded), inferred over HTTP with tritonclient, and clear load errors for .pt2 files the
backend cannot serve."""

from __future__ import annotations

import io
import shutil
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")

import torch
import tritonclient.http as httpclient

sys.path.insert(0, str(Path(__file__).parent))
from backend_testlib import NO_METRICS, http_infer, index, write_model

# TorchScript (used for the "TorchScript saved as .pt2" case) warns that it is deprecated.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")

COMPILER = shutil.which("c++") or shutil.which("g++")
HAS_AOTI = hasattr(getattr(torch, "_inductor", None), "aoti_compile_and_package")


class AddSub(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a + b, a - b


class Scale(torch.nn.Module):
    """A module with weights (a buffer and a parameter), so that the package carries them."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.arange(4, dtype=torch.float32) + 1.0)
        self.register_buffer("offset", torch.full((4,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight + self.offset


def _exported(module: torch.nn.Module, examples: tuple[torch.Tensor, ...]) -> Any:
    batch = torch.export.Dim("batch", min=1, max=8)
    with warnings.catch_warnings():
        # torch 2.13's own pytree code: "`isinstance(treespec, LeafSpec)` is deprecated".
        warnings.simplefilter("ignore", FutureWarning)
        return torch.export.export(
            module.eval(), examples, dynamic_shapes=tuple({0: batch} for _ in examples)
        )


def _exported_bytes(module: torch.nn.Module, examples: tuple[torch.Tensor, ...]) -> bytes:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.export.save(_exported(module, examples), buffer)
    return buffer.getvalue()


def _aoti_bytes(tmp: Path) -> bytes:
    """An AOTInductor package of Scale (compiling it takes ~30-50 s on the 2-core dev machine)."""
    path = tmp / "scale_aoti.pt2"
    program = _exported(Scale(), (torch.ones(2, 4),))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch._inductor.aoti_compile_and_package(program, package_path=str(path))
    return path.read_bytes()


def _config(name: str, body: str, platform: str = "torch_aoti", max_batch: int = 8) -> str:
    head = f'name: "{name}"\n' + (f'platform: "{platform}"\n' if platform else "")
    return f"{head}max_batch_size: {max_batch}\n{body}"


ADD_SUB_IO = """
input [ { name: "b" data_type: TYPE_FP32 dims: [ 3 ] },
        { name: "a" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "SUM__0" data_type: TYPE_FP32 dims: [ 3 ] },
         { name: "DIFF__1" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""
SCALE_IO = """
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("pt2")
    add_sub = _exported_bytes(AddSub(), (torch.ones(2, 3), torch.ones(2, 3)))
    write_model(repo, "add_sub_pt2", _config("add_sub_pt2", ADD_SUB_IO), {"model.pt2": add_sub})
    # No platform and no backend: recognized by its model.pt2 (auto-complete).
    write_model(
        repo,
        "scale_pt2",
        _config("scale_pt2", SCALE_IO, platform=""),
        {"model.pt2": _exported_bytes(Scale(), (torch.ones(2, 4),))},
    )
    if COMPILER and HAS_AOTI:
        write_model(
            repo,
            "scale_aoti",
            _config("scale_aoti", SCALE_IO),
            {"model.pt2": _aoti_bytes(tmp_path_factory.mktemp("aoti"))},
        )
    # Load errors.
    write_model(
        repo, "bad_not_zip", _config("bad_not_zip", SCALE_IO), {"model.pt2": b"not a package"}
    )
    scripted = io.BytesIO()
    torch.jit.save(torch.jit.script(Scale()), scripted)
    write_model(
        repo,
        "bad_torchscript",
        _config("bad_torchscript", SCALE_IO),
        {"model.pt2": scripted.getvalue()},
    )
    other_zip = io.BytesIO()
    with zipfile.ZipFile(other_zip, "w") as archive:
        archive.writestr("model/readme.txt", "an unrelated archive")
    write_model(
        repo,
        "bad_other_zip",
        _config("bad_other_zip", SCALE_IO),
        {"model.pt2": other_zip.getvalue()},
    )
    write_model(
        repo,
        "bad_datatype",
        _config(
            "bad_datatype",
            SCALE_IO.replace(
                "TYPE_FP32 dims: [ 4 ] } ]\noutput", "TYPE_INT32 dims: [ 4 ] } ]\noutput"
            ),
        ),
        {"model.pt2": _exported_bytes(Scale(), (torch.ones(2, 4),))},
    )
    write_model(
        repo,
        "bad_input_count",
        _config(
            "bad_input_count",
            SCALE_IO.replace(
                "input [ {", 'input [ { name: "INPUT__1" data_type: TYPE_FP32 dims: [ 4 ] }, {'
            ),
        ),
        {"model.pt2": _exported_bytes(Scale(), (torch.ones(2, 4),))},
    )
    write_model(
        repo,
        "bad_string",
        _config(
            "bad_string",
            SCALE_IO.replace(
                'output [ { name: "OUTPUT__0" data_type: TYPE_FP32',
                'output [ { name: "OUTPUT__0" data_type: TYPE_STRING',
            ),
        ),
        {"model.pt2": _exported_bytes(Scale(), (torch.ones(2, 4),))},
    )
    return repo


@pytest.fixture(scope="module")
def server(repository: Path, launch_module: Any) -> Any:
    return launch_module([repository], ["--exit-on-error=false", "--allow-grpc=false", *NO_METRICS])


def test_exported_program_serves_over_http(server: Any) -> None:
    """Inputs are matched by the program's input names (config order is b, a)."""
    rng = np.random.default_rng(0)
    for rows in (1, 3):
        a = rng.standard_normal((rows, 3), dtype=np.float32)
        b = rng.standard_normal((rows, 3), dtype=np.float32)
        result = http_infer(server.http_url, "add_sub_pt2", {"a": a, "b": b})
        np.testing.assert_allclose(result.as_numpy("SUM__0"), a + b, rtol=1e-6)
        np.testing.assert_allclose(result.as_numpy("DIFF__1"), a - b, rtol=1e-6)


def test_model_pt2_is_recognized_as_torch_aoti(server: Any) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    result = http_infer(server.http_url, "scale_pt2", {"INPUT__0": x})
    np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), x * np.arange(1, 5) + 0.5)
    config = httpclient.InferenceServerClient(server.http_url).get_model_config("scale_pt2")
    assert (config["platform"], config["backend"]) == ("torch_aoti", "pytorch")
    assert config["default_model_filename"] == "model.pt2"


@pytest.mark.skipif(not HAS_AOTI, reason="this torch has no AOTInductor")
@pytest.mark.skipif(COMPILER is None, reason="AOTInductor needs a C++ compiler to build a package")
def test_aoti_package_serves_over_http(server: Any) -> None:
    x = np.random.default_rng(1).standard_normal((5, 4), dtype=np.float32)
    result = http_infer(server.http_url, "scale_aoti", {"INPUT__0": x})
    np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), x * np.arange(1, 5) + 0.5, rtol=1e-6)


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("bad_not_zip", "'model.pt2' is not a PyTorch 2 package (a .pt2 zip archive"),
        ("bad_torchscript", "'model.pt2' is a TorchScript archive, not a PyTorch 2 package"),
        ("bad_other_zip", "holds neither an AOTInductor model nor an ExportedProgram"),
        (
            "bad_datatype",
            "configuration expects datatype TYPE_INT32 for input 'INPUT__0', model provides "
            "TYPE_FP32",
        ),
        ("bad_input_count", "configuration expects 2 inputs, model provides 1"),
        ("bad_string", "output 'OUTPUT__0' is TYPE_STRING, but a PyTorch 2 package"),
    ],
)
def test_unusable_pt2_fails_to_load_saying_why(server: Any, model: str, expected: str) -> None:
    entry = index(server.http_url)[model]
    assert entry["state"] == "UNAVAILABLE"
    assert expected in entry["reason"]
