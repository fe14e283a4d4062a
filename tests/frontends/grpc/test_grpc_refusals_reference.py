"""The gRPC infer path's refusals, as the real Triton 2.51 worded them for the same requests
(issue 31; docs/triton-reference-behaviour.md, section 17): classification, batch sizes,
shapes, datatypes and parameters (the accepted side: test_grpc_reference.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
from reference_requests import INVALID, ROW, cls, request, scores
from tritonclient.grpc import service_pb2_grpc

MODELS = Path(__file__).parent / "models"


@pytest.fixture(scope="module")
def stub(model_repository: Path, launch_module: Any) -> Any:
    loads = ["simple", "scores", "scores_nobatch", "scores_ensemble", "var_add_sub"]
    args = ["--model-control-mode=explicit", *(f"--load-model={m}" for m in loads)]
    server = launch_module([model_repository, MODELS], [*args, "--allow-metrics=false"])
    channel = grpc.insecure_channel(server.grpc_url)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


# (case, request, status, Triton 2.51's text)
REFUSED = [
    (
        "classification of FP16",
        scores(outputs=(("OUTPUT2", cls(2)),)),
        INVALID,
        "class result not available for output due to unsupported type 'FP16'",
    ),
    (
        # Triton 2.51 crashes on this one (the server exits); we refuse it as FP16 is refused
        "classification of BYTES (stricter)",
        scores(outputs=(("OUTPUT3", cls(2)),)),
        INVALID,
        "class result not available for output due to unsupported type 'BYTES'",
    ),
    *(
        (
            f"classification {k}",
            scores(outputs=(("OUTPUT0", cls(k)),)),
            INVALID,
            "invalid value for 'classification' parameter, expected >= 0",
        )
        for k in (0, -1)
    ),
    *(
        (
            f"classification as {type(k).__name__}",
            scores(outputs=(("OUTPUT0", cls(k)),)),
            INVALID,
            "invalid value type for 'classification' parameter, expected int64_param",
        )
        for k in ("2", True, 2.0)
    ),
    (
        "shared memory and classification",
        request(
            outputs=(
                (
                    "OUTPUT0",
                    {
                        "shared_memory_region": "r",
                        "shared_memory_byte_size": 64,
                        "classification": 1,
                    },
                ),
            )
        ),
        INVALID,
        "output can't set both 'shared_memory_region' and 'classification'",
    ),
]

BATCH = "[request id: {id}] input 'INPUT0' batch size does not match other inputs for 'simple'"
SHAPE_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to "
    "be prepended to each input shape. If you want to specify the full shape including the "
    "batch dim in your input dims config, try setting max_batch_size to zero. See the model "
    "configuration docs for more info on max_batch_size."
)
DTYPE = (
    "[request id: {id}] inference input 'INPUT0' data-type is '{dt}', but model '{m}' expects "
    "'INT32'"
)
I1 = {"name": "INPUT1"}


def bad(**spec: Any) -> list[dict[str, Any]]:
    return [{"name": "INPUT0", **spec}, I1]


REFUSED += [
    (
        "negative batch dimension",
        request(inputs=bad(shape=[-1, 16])),
        INVALID,
        BATCH.format(id="v1"),
    ),
    (
        "negative batch dimension, no id",
        request(inputs=bad(shape=[-1, 16]), rid=""),
        INVALID,
        BATCH.format(id="<id_unknown>"),
    ),
    (
        "both batch dimensions negative",
        request(
            inputs=[{"name": "INPUT0", "shape": [-1, 16]}, {"name": "INPUT1", "shape": [-1, 16]}]
        ),
        INVALID,
        BATCH.format(id="v1"),
    ),
    (
        "the second input's batch dimension negative",
        request(inputs=[{"name": "INPUT0"}, {"name": "INPUT1", "shape": [-1, 16]}]),
        INVALID,
        BATCH.format(id="v1"),
    ),
    (
        "a 2^40 batch dimension",
        request(inputs=bad(shape=[2**40, 2**40])),
        INVALID,
        BATCH.format(id="v1"),
    ),
    (
        "negative dimension",
        request(inputs=bad(shape=[1, -16])),
        INVALID,
        "[request id: v1] unexpected shape for input 'INPUT0' for model 'simple'. Expected "
        f"[-1,16], got [1,-16]. {SHAPE_NOTE}",
    ),
    (
        "negative variable dimension",
        request("var_add_sub", [{"name": "INPUT0", "shape": [1, -16]}, I1]),
        INVALID,
        "[request id: v1] input byte size mismatch for input 'INPUT0' for model 'var_add_sub'. "
        "Expected -64, got 64",
    ),
    (
        "negative variable dimensions, both inputs",
        request(
            "var_add_sub",
            [{"name": "INPUT0", "shape": [1, -16]}, {"name": "INPUT1", "shape": [1, -16]}],
        ),
        INVALID,
        "[request id: v1] input byte size mismatch for input 'INPUT1' for model 'var_add_sub'. "
        "Expected -64, got 64",
    ),
    (
        "negative dimension, no batching",
        request(
            "scores_nobatch",
            [{"name": "INPUT0", "datatype": "FP32", "shape": [-2, 3]}],
            [b"\0" * 24],
        ),
        INVALID,
        "[request id: v1] unexpected shape for input 'INPUT0' for model 'scores_nobatch'. "
        "Expected [2,3], got [-2,3]. ",
    ),
    *(
        (
            f"datatype {dt!r}",
            request(inputs=bad(datatype=dt)),
            INVALID,
            DTYPE.format(id="v1", dt="<invalid>", m="simple"),
        )
        for dt in ("INT33", "", "int32", "TYPE_INT32")
    ),
    (
        "unknown datatype, no id",
        request(inputs=bad(datatype="INT33"), rid=""),
        INVALID,
        DTYPE.format(id="<id_unknown>", dt="<invalid>", m="simple"),
    ),
    (
        "unknown datatype and a wrong shape: the datatype first",
        request(inputs=bad(datatype="INT33", shape=[1, 17])),
        INVALID,
        DTYPE.format(id="v1", dt="<invalid>", m="simple"),
    ),
    (
        "unknown datatype, negative variable dimension",
        request("var_add_sub", [{"name": "INPUT0", "shape": [1, -16], "datatype": "INT33"}, I1]),
        INVALID,
        DTYPE.format(id="v1", dt="<invalid>", m="var_add_sub"),
    ),
    (
        "unknown datatype of an unknown input: the name first",
        request(inputs=[{"name": "INPUTX", "datatype": "INT33"}, I1]),
        INVALID,
        "unexpected inference input 'INPUTX' for model 'simple'",
    ),
    (
        "unknown datatype with contents and raw",
        request(inputs=bad(datatype="INT33", contents={"int_contents": [1] * 16}), raw=[ROW]),
        INVALID,
        "contents field must not be specified when using raw_input_contents for 'INPUT0' for "
        "model 'simple'",
    ),
    (
        "unknown datatype, no data",
        request(inputs=bad(datatype="INT33"), raw=[]),
        INVALID,
        "unable to find data for input tensor 'INPUT0' for model 'simple' in request.",
    ),
    (
        "wrong datatype",
        request(inputs=bad(datatype="FP32")),
        INVALID,
        DTYPE.format(id="v1", dt="FP32", m="simple"),
    ),
    (
        "raw too short",
        request(raw=[ROW[:60], ROW]),
        INVALID,
        "[request id: v1] input byte size mismatch for input 'INPUT0' for model 'simple'. "
        "Expected 64, got 60",
    ),
    (
        "contents of another type",
        request(inputs=bad(contents={"fp32_contents": [1.0] * 16}), raw=[]),
        INVALID,
        "unexpected explicit tensor data for input tensor 'INPUT0' for model 'simple' of type "
        "'FP32', expected datatype 'INT32'",
    ),
    (
        "two contents fields",
        request(
            inputs=[
                {
                    "name": "INPUT0",
                    "contents": {"int_contents": [1] * 16, "int64_contents": [1] * 16},
                },
                {"name": "INPUT1", "contents": {"int_contents": [1] * 16}},
            ],
            raw=[],
        ),
        INVALID,
        "unexpected explicit tensor data for input tensor 'INPUT0' for model 'simple', binary "
        "data was already supplied.",
    ),
    (
        "a duplicate input",
        request(inputs=[{"name": "INPUT0"}, {"name": "INPUT0"}, I1], raw=[ROW] * 3),
        INVALID,
        "[request id: v1] input 'INPUT0' already exists in request",
    ),
    (
        "no shape",
        request(inputs=bad(shape=[])),
        INVALID,
        "[request id: v1] input 'INPUT0' has no shape but model requires batch dimension for "
        "'simple'",
    ),
    (
        "a batch of zero",
        request(
            inputs=[{"name": "INPUT0", "shape": [0, 16]}, {"name": "INPUT1", "shape": [0, 16]}],
            raw=[b"", b""],
        ),
        INVALID,
        "[request id: v1] input byte size mismatch for input 'INPUT1' for model 'simple'. "
        "Expected 64, got 0",
    ),
    (
        "version abc",
        request(version="abc"),
        INVALID,
        "failed to get model version from specified version string 'abc' (details: stol), "
        "version should be an integral value > 0",
    ),
    (
        "version 0",
        request(version="0"),
        "NOT_FOUND",
        "Request for unknown model: 'simple' version 0 is not found",
    ),
    (
        "a uint64 parameter",
        request(params={"custom": ("uint64_param", 5)}),
        INVALID,
        "invalid value type for 'custom' parameter, expected int64_param, bool_param, or "
        "string_param.",
    ),
    (
        "timeout as uint64",
        request(params={"timeout": ("uint64_param", 5)}),
        INVALID,
        "invalid value type for 'timeout' parameter, expected int64_param.",
    ),
    (
        "empty model name",
        request(model=""),
        "NOT_FOUND",
        "Request for unknown model: '' is not found",
    ),
]


@pytest.mark.parametrize("case", REFUSED, ids=[c[0] for c in REFUSED])
def test_grpc_refusals_as_triton(stub: Any, case: tuple[str, Any, str, str]) -> None:
    _, message, status, text = case
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(message)
    assert (caught.value.code().name, caught.value.details()) == (status, text)
