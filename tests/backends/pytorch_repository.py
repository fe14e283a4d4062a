"""The PyTorch backend tests' repository: the generated example models and small TorchScript
models built here (identity per datatype, inputs by argument name, dict and string inputs) and
models that must fail to load, each naming what is wrong."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import torch
from backend_testlib import write_model

from oceanus.examples.repository import framework_available, write_example_repository

SIMPLE_IO = """
input [ { name: "INPUT__0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT__1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_INT32 dims: [ 16 ] },
         { name: "OUTPUT__1" data_type: TYPE_INT32 dims: [ 16 ] } ]
"""

# Config datatype -> numpy dtype for the identity models.
IDENTITY_TYPES = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BF16": ml_dtypes.bfloat16,
}
for _bits in (16, 32, 64):
    if isinstance(getattr(torch, f"uint{_bits}", None), torch.dtype):
        IDENTITY_TYPES[f"UINT{_bits}"] = np.dtype(f"uint{_bits}").type


def script(cls: type) -> Any:
    return torch.jit.script(cls())


def _saved(module: Any) -> bytes:
    buffer = io.BytesIO()
    torch.jit.save(module, buffer)
    return buffer.getvalue()


class Identity(torch.nn.Module):
    def forward(self, INPUT__0: torch.Tensor) -> torch.Tensor:
        return INPUT__0.clone()


class Minus(torch.nn.Module):
    """Inputs matched by forward() argument names; a list of tensors out."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> list[torch.Tensor]:
        return [a - b, a * 2]


class Times(torch.nn.Module):
    """One Dict(str, Tensor) argument: inputs by name."""

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs["x"] * inputs["y"]


class Upper(torch.nn.Module):
    """TYPE_STRING in and out as List[str] (TorchScript's str methods work on bytes)."""

    def forward(self, text: list[str]) -> tuple[list[str], torch.Tensor]:
        lengths = [len(s) for s in text]
        return [s.upper() for s in text], torch.tensor(lengths, dtype=torch.int64)


def _config(name: str, max_batch: int, body: str, extra: str = "") -> str:
    head = f'name: "{name}"\nplatform: "pytorch_libtorch"\nmax_batch_size: {max_batch}\n'
    return f"{head}{body}\n{extra}"


def write_pytorch_repository(root: Path) -> Path:
    """The example models plus TorchScript models built here, each for one behaviour."""
    names = ["simple_pytorch", "resnet_small_pytorch", "simple"]
    if framework_available("openvino"):
        names.append("simple_openvino")
    repo = write_example_repository(root, names)
    simple_pt = repo / "simple_pytorch" / "1" / "model.pt"
    # The generated add/sub model without batching, dims including the "batch".
    write_model(
        repo,
        "simple_pytorch_nobatch",
        _config("simple_pytorch_nobatch", 0, SIMPLE_IO.replace("dims: [ 16 ]", "dims: [ -1, 16 ]")),
        {"model.pt": simple_pt},
    )
    identity = _saved(script(Identity))
    for datatype in IDENTITY_TYPES:
        name = f"identity_pt_{datatype.lower()}"
        io = (
            f'input [ {{ name: "INPUT__0" data_type: TYPE_{datatype} dims: [ -1 ] }} ]\n'
            f'output [ {{ name: "OUTPUT__0" data_type: TYPE_{datatype} dims: [ -1 ] }} ]'
        )
        write_model(repo, name, _config(name, 8, io), {"model.pt": identity})
    write_model(
        repo,
        "by_argument_name",
        _config(
            "by_argument_name",
            4,
            """
input [ { name: "b" data_type: TYPE_FP32 dims: [ 3 ] },
        { name: "a" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "DIFF__0" data_type: TYPE_FP32 dims: [ 3 ] },
         { name: "DOUBLE__1" data_type: TYPE_FP32 dims: [ 3 ] } ]
""",
        ),
        {"model.pt": _saved(script(Minus))},
    )
    write_model(
        repo,
        "dict_input",
        _config(
            "dict_input",
            0,
            """
input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] },
        { name: "y" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]
""",
        ),
        {"model.pt": _saved(script(Times))},
    )
    write_model(
        repo,
        "strings",
        _config(
            "strings",
            0,
            """
input [ { name: "INPUT__0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_STRING dims: [ -1 ] },
         { name: "OUTPUT__1" data_type: TYPE_INT64 dims: [ -1 ] } ]
""",
        ),
        {"model.pt": _saved(script(Upper))},
    )
    # Output datatype that the model does not produce: found when it runs, as in Triton.
    write_model(
        repo,
        "wrong_output_type",
        _config(
            "wrong_output_type",
            8,
            SIMPLE_IO.replace(
                'name: "OUTPUT__1" data_type: TYPE_INT32', 'name: "OUTPUT__1" data_type: TYPE_FP32'
            ),
        ),
        {"model.pt": simple_pt},
    )
    # Load errors, each naming what is wrong.
    write_model(
        repo,
        "bad_no_inputs",
        'platform: "pytorch_libtorch"\nmax_batch_size: 8\n',
        {"model.pt": simple_pt},
    )
    write_model(repo, "bad_autocomplete", "", {"model.pt": simple_pt})
    write_model(
        repo,
        "bad_output_index",
        _config("bad_output_index", 8, SIMPLE_IO.replace("OUTPUT__1", "OUTPUT__5")),
        {"model.pt": simple_pt},
    )
    write_model(
        repo,
        "bad_input_count",
        _config(
            "bad_input_count",
            8,
            SIMPLE_IO.replace(
                "input [ {", 'input [ { name: "INPUT__2" data_type: TYPE_INT32 dims: [ 16 ] }, {'
            ),
        ),
        {"model.pt": simple_pt},
    )
    write_model(
        repo,
        "bad_string_tensor",
        _config(
            "bad_string_tensor",
            8,
            SIMPLE_IO.replace(
                'name: "INPUT__1" data_type: TYPE_INT32', 'name: "INPUT__1" data_type: TYPE_STRING'
            ),
        ),
        {"model.pt": simple_pt},
    )
    write_model(
        repo,
        "bad_file",
        _config("bad_file", 8, SIMPLE_IO),
        {"model.pt": b"PK\x03\x04 this is not TorchScript"},
    )
    write_model(
        repo,
        "bad_parameter",
        _config(
            "bad_parameter",
            8,
            SIMPLE_IO,
            'parameters { key: "INFERENCE_MODE" value: { string_value: "maybe" } }',
        ),
        {"model.pt": simple_pt},
    )
    return repo
