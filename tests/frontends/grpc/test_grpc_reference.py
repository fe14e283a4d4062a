"""gRPC answered as the real Triton 2.51 answered the same requests (issue 31; recorded in
docs/triton-reference-behaviour.md, section 17, against `../shared/triton-reference/start.sh`
on the models in ./models and the example `simple`): the classification extension over gRPC,
HTTP and an ensemble, server metadata's extensions, unloading a model that is not there, and
(the validation texts of the gRPC infer path: test_grpc_refusals_reference.py)."""

from __future__ import annotations

import http.client
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
from reference_requests import SCORES, cls, request, scores
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

MODELS = Path(__file__).parent / "models"
EXTENSIONS = [
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "cuda_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
]


@pytest.fixture(scope="module")
def server(model_repository: Path, launch_module: Any) -> Any:
    loads = ["simple", "scores", "scores_nobatch", "scores_ensemble", "var_add_sub"]
    args = ["--model-control-mode=explicit", *(f"--load-model={m}" for m in loads)]
    return launch_module([model_repository, MODELS], [*args, "--allow-metrics=false"])


@pytest.fixture(scope="module")
def stub(server: Any) -> Any:
    channel = grpc.insecure_channel(server.grpc_url)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def answer(response: Any) -> list[tuple[str, str, list[int], Any]]:
    """Each output as (name, datatype, shape, the BYTES strings or the raw hex)."""
    decoded = []
    for output, raw in zip(response.outputs, response.raw_output_contents, strict=True):
        data: Any = raw.hex()
        if output.datatype == "BYTES":
            data, offset = [], 0
            while offset < len(raw):
                size = int.from_bytes(raw[offset : offset + 4], "little")
                data.append(raw[offset + 4 : offset + 4 + size].decode())
                offset += 4 + size
        decoded.append((output.name, output.datatype, list(output.shape), data))
    return decoded


# (case, request, Triton 2.51's answer)
CLASSIFIED = [
    (
        "k=2 with labels, a tie",
        scores(outputs=(("OUTPUT0", cls(2)),)),
        [("OUTPUT0", "BYTES", [1, 2], ["0.700000:1:dog", "0.700000:3:fish"])],
    ),
    (
        "INT32, no label file",
        scores(outputs=(("OUTPUT1", cls(3)),)),
        [("OUTPUT1", "BYTES", [1, 3], ["7:1", "7:3", "2:2"])],
    ),
    (
        "k above the class count; an index past the labels has none",
        scores(outputs=(("OUTPUT0", cls(10)),)),
        [
            (
                "OUTPUT0",
                "BYTES",
                [1, 5],
                [
                    "0.700000:1:dog",
                    "0.700000:3:fish",
                    "0.200000:2:bird",
                    "0.100000:0:cat",
                    "-1.000000:4",
                ],
            )
        ],
    ),
    (
        "a batch of two: k per row",
        scores(rows=((1, 2, 3, 4, 5), (5, 4, 3, 2, 1)), outputs=(("OUTPUT0", cls(2)),)),
        [
            (
                "OUTPUT0",
                "BYTES",
                [2, 2],
                ["5.000000:4", "4.000000:3:fish", "5.000000:0:cat", "4.000000:1:dog"],
            )
        ],
    ),
    (
        "one output classified, the other not",
        scores(outputs=(("OUTPUT0", cls(1)), ("OUTPUT1", {}))),
        [
            ("OUTPUT0", "BYTES", [1, 1], ["0.700000:1:dog"]),
            ("OUTPUT1", "INT32", [1, 5], "01000000070000000200000007000000f6ffffff"),
        ],
    ),
    (
        "non-batched [2,3]: k over all elements",
        scores("scores_nobatch", ((1, 9, 3), (7, 5, 6)), (("OUTPUT0", cls(2)),)),
        [("OUTPUT0", "BYTES", [2], ["9.000000:1:b", "7.000000:3:d"])],
    ),
    (
        "non-batched INT32",
        scores("scores_nobatch", ((1, 9, 3), (7, 5, 6)), (("OUTPUT1", cls(4)),)),
        [("OUTPUT1", "BYTES", [4], ["90:1", "70:3", "60:5", "50:4"])],
    ),
    (
        "an ensemble: the ensemble's own labels",
        scores("scores_ensemble", outputs=(("OUT", cls(2)),), input_name="IN"),
        [("OUT", "BYTES", [1, 2], ["0.700000:1:E1", "0.700000:3:E3"])],
    ),
    (
        "an ensemble's INT32 output",
        scores("scores_ensemble", outputs=(("OUTI", cls(2)),), input_name="IN"),
        [("OUTI", "BYTES", [1, 2], ["7:1", "7:3"])],
    ),
    (
        "all tied: index order",
        scores(rows=((1, 1, 1, 1, 1),), outputs=(("OUTPUT0", cls(5)),)),
        [
            (
                "OUTPUT0",
                "BYTES",
                [1, 5],
                [
                    "1.000000:0:cat",
                    "1.000000:1:dog",
                    "1.000000:2:bird",
                    "1.000000:3:fish",
                    "1.000000:4",
                ],
            )
        ],
    ),
    (
        "%f of large and small floats",
        scores(rows=((123456.789, 1e-7, -3.5, 0.333333343, 1e20),), outputs=(("OUTPUT0", cls(5)),)),
        [
            (
                "OUTPUT0",
                "BYTES",
                [1, 5],
                [
                    "100000002004087734272.000000:4",
                    "123456.789062:0:cat",
                    "0.333333:3:fish",
                    "0.000000:1:dog",
                    "-3.500000:2:bird",
                ],
            )
        ],
    ),
    (
        "binary_data alongside",
        scores(outputs=(("OUTPUT0", {"classification": 2, "binary_data": True}),)),
        [("OUTPUT0", "BYTES", [1, 2], ["0.700000:1:dog", "0.700000:3:fish"])],
    ),
    (
        "an output asked twice, classified once",
        request(outputs=(("OUTPUT0", {}), ("OUTPUT0", cls(1)))),
        [("OUTPUT0", "BYTES", [1, 1], ["30:15"])],
    ),
]


@pytest.mark.parametrize("case", CLASSIFIED, ids=[c[0] for c in CLASSIFIED])
def test_grpc_classification_as_triton(stub: Any, case: tuple[str, Any, Any]) -> None:
    _, message, expected = case
    assert answer(stub.ModelInfer(message)) == expected


def test_server_metadata_lists_triton_extensions(stub: Any, server: Any) -> None:
    metadata = stub.ServerMetadata(pb.ServerMetadataRequest())
    assert list(metadata.extensions) == EXTENSIONS
    assert get(server, "/v2")[1]["extensions"] == EXTENSIONS


def test_unloading_a_model_not_there_succeeds(stub: Any, server: Any) -> None:
    for name in ("nosuch", ""):  # Triton 2.51: success, and nothing appears in the index
        stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name=name))
    assert post(server, "/v2/repository/models/nosuch/unload", b"") == (200, None)
    body = orjson.dumps({"parameters": {"unload_dependents": True}})
    assert post(server, "/v2/repository/models/nosuch/unload", body) == (200, None)
    index = stub.RepositoryIndex(pb.RepositoryIndexRequest())
    assert "nosuch" not in {model.name for model in index.models}


def get(server: Any, path: str) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read()
        return response.status, orjson.loads(body) if body else None
    finally:
        connection.close()


def post(server: Any, path: str, body: bytes) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    try:
        connection.request("POST", path, body=body)
        response = connection.getresponse()
        data = response.read()
        return response.status, orjson.loads(data) if data else None
    finally:
        connection.close()


X = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 5], "data": list(SCORES)}
NOT_UNSIGNED = {
    "error": "Unable to set 'classification': attempt to access JSON non-unsigned-integer as "
    "unsigned-integer"
}
# (case, model, output, Triton 2.51's status (4xx where it said 500) and body)
HTTP_CASES = [
    (
        "k=2",
        "scores",
        {"name": "OUTPUT0", "parameters": {"classification": 2}},
        200,
        {
            "model_name": "scores",
            "model_version": "1",
            "outputs": [
                {
                    "name": "OUTPUT0",
                    "datatype": "BYTES",
                    "shape": [1, 2],
                    "data": ["0.700000:1:dog", "0.700000:3:fish"],
                }
            ],
        },
    ),
    (
        "INT32",
        "scores",
        {"name": "OUTPUT1", "parameters": {"classification": 3}},
        200,
        {
            "model_name": "scores",
            "model_version": "1",
            "outputs": [
                {
                    "name": "OUTPUT1",
                    "datatype": "BYTES",
                    "shape": [1, 3],
                    "data": ["7:1", "7:3", "2:2"],
                }
            ],
        },
    ),
    (
        "0: the tensor itself",
        "scores",
        {"name": "OUTPUT1", "parameters": {"classification": 0}},
        200,
        {
            "model_name": "scores",
            "model_version": "1",
            "outputs": [
                {"name": "OUTPUT1", "datatype": "INT32", "shape": [1, 5], "data": [1, 7, 2, 7, -10]}
            ],
        },
    ),
    *(
        (
            f"{k!r}",
            "scores",
            {"name": "OUTPUT0", "parameters": {"classification": k}},
            400,
            NOT_UNSIGNED,
        )
        for k in ("2", -1, 2.5, True)
    ),
    (
        "FP16",
        "scores",
        {"name": "OUTPUT2", "parameters": {"classification": 2}},
        400,
        {"error": "class result not available for output due to unsupported type 'FP16'"},
    ),
]


@pytest.mark.parametrize("case", HTTP_CASES, ids=[c[0] for c in HTTP_CASES])
def test_http_classification_as_triton(server: Any, case: tuple[str, str, Any, int, Any]) -> None:
    _, model, output, status, body = case
    document = {"inputs": [X], "outputs": [output]}
    assert post(server, f"/v2/models/{model}/infer", orjson.dumps(document)) == (status, body)


def test_http_classification_binary_and_ensemble(server: Any) -> None:
    # binary: Triton's 37 bytes, two length-framed strings after the JSON header
    document = {
        "inputs": [X],
        "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 2, "binary_data": True}}],
    }
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    try:
        connection.request("POST", "/v2/models/scores/infer", body=orjson.dumps(document))
        response = connection.getresponse()
        body = response.read()
        size = int(response.getheader("Inference-Header-Content-Length"))
    finally:
        connection.close()
    header = orjson.loads(body[:size])
    assert header["outputs"] == [
        {
            "name": "OUTPUT0",
            "datatype": "BYTES",
            "shape": [1, 2],
            "parameters": {"binary_data_size": 37},
        }
    ]
    assert body[size:] == b"\x0e\0\0\x000.700000:1:dog\x0f\0\0\x000.700000:3:fish"
    ensemble = {
        "inputs": [dict(X, name="IN")],
        "outputs": [{"name": "OUT", "parameters": {"classification": 2}}],
    }
    status, answer_ = post(server, "/v2/models/scores_ensemble/infer", orjson.dumps(ensemble))
    assert status == 200
    assert answer_["outputs"] == [
        {
            "name": "OUT",
            "datatype": "BYTES",
            "shape": [1, 2],
            "data": ["0.700000:1:E1", "0.700000:3:E3"],
        }
    ]
