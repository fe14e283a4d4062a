"""Inference over HTTP: every datatype in JSON and binary, outputs, ids, compression."""

from __future__ import annotations

import asyncio
import gzip
import http.client
import struct
import zlib
from typing import Any

import ml_dtypes
import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient

NUMERIC = {
    "BOOL": np.bool_,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BF16": ml_dtypes.bfloat16,
}
JSON_CAPABLE = [t for t in NUMERIC if t not in ("FP16", "BF16")]


def sample(datatype: str) -> np.ndarray:
    rng = np.random.default_rng(7)
    if datatype == "BYTES":
        return np.array([[b"hello", b"w\x00rld", "\u00e9t\u00e9".encode(), b""]], dtype=object)
    if datatype == "BOOL":
        return rng.integers(0, 2, size=(2, 5)).astype(np.bool_)
    dtype = np.dtype(NUMERIC[datatype])
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.array([[info.min, info.max, 0, 1, 7], [3, 4, 5, 6, info.max - 1]], dtype=dtype)
    return (rng.standard_normal((2, 5)) * 100).astype(dtype)


def identity(server: Any, datatype: str, binary: bool) -> tuple[np.ndarray, np.ndarray]:
    client = httpclient.InferenceServerClient(server.http_url)
    data = sample(datatype)
    tensor = httpclient.InferInput("INPUT0", list(data.shape), datatype)
    tensor.set_data_from_numpy(data, binary_data=binary)
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
    result = client.infer(f"identity_{datatype.lower()}", [tensor], outputs=[output])
    return data, result.as_numpy("OUTPUT0")


@pytest.mark.parametrize("datatype", [*NUMERIC, "BYTES"])
def test_identity_binary_round_trip(server: Any, datatype: str) -> None:
    sent, received = identity(server, datatype, binary=True)
    assert received.dtype == sent.dtype
    assert received.shape == sent.shape
    assert np.array_equal(received, sent)


@pytest.mark.parametrize("datatype", [*JSON_CAPABLE, "BYTES"])
def test_identity_json_round_trip(server: Any, datatype: str) -> None:
    sent, received = identity(server, datatype, binary=False)
    assert received.shape == sent.shape
    if datatype == "BYTES":  # JSON carries BYTES as strings
        assert [s.encode() for s in received.reshape(-1)] == list(sent.reshape(-1))
    else:
        assert np.array_equal(received.astype(sent.dtype), sent)


def simple_inputs(
    binary: bool = True,
) -> tuple[list[httpclient.InferInput], np.ndarray, np.ndarray]:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    inputs = []
    for name, value in (("INPUT0", a), ("INPUT1", b)):
        tensor = httpclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(value, binary_data=binary)
        inputs.append(tensor)
    return inputs, a, b


def test_simple_sum_and_difference_with_request_id(server: Any) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    inputs, a, b = simple_inputs()
    result = client.infer("simple", inputs, request_id="req-42")
    assert np.array_equal(result.as_numpy("OUTPUT0"), a + b)
    assert np.array_equal(result.as_numpy("OUTPUT1"), a - b)
    response = result.get_response()
    assert response["id"] == "req-42"
    assert response["model_name"] == "simple"
    assert response["model_version"] == "1"


def test_subset_of_outputs(server: Any) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    inputs, a, b = simple_inputs()
    result = client.infer("simple", inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    assert result.as_numpy("OUTPUT0") is None
    assert np.array_equal(result.as_numpy("OUTPUT1"), a - b)


def post(
    server: Any, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    connection.request("POST", path, body=body, headers=headers or {})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, data


SIMPLE_JSON = {
    "inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [[1] * 16]},
    ]
}


def test_json_response_layout(server: Any) -> None:
    status, headers, body = post(server, "/v2/models/simple/infer", orjson.dumps(SIMPLE_JSON))
    assert status == 200
    assert headers["content-type"] == "application/json"
    assert orjson.loads(body) == {
        "model_name": "simple",
        "model_version": "1",
        "outputs": [
            {
                "name": "OUTPUT0",
                "datatype": "INT32",
                "shape": [1, 16],
                "data": [i + 1 for i in range(16)],
            },
            {
                "name": "OUTPUT1",
                "datatype": "INT32",
                "shape": [1, 16],
                "data": [i - 1 for i in range(16)],
            },
        ],
    }


def test_binary_data_output_parameter_and_raw_wire(server: Any) -> None:
    document = {**SIMPLE_JSON, "parameters": {"binary_data_output": True}}
    status, headers, body = post(
        server, "/v2/models/simple/versions/1/infer", orjson.dumps(document)
    )
    assert status == 200
    assert headers["content-type"] == "application/octet-stream"
    json_size = int(headers["inference-header-content-length"])
    header = orjson.loads(body[:json_size])
    assert [o["parameters"]["binary_data_size"] for o in header["outputs"]] == [64, 64]
    first = np.frombuffer(body[json_size : json_size + 64], dtype="<i4")
    assert first.tolist() == [i + 1 for i in range(16)]


def test_binary_request_on_the_wire_with_bytes_framing(server: Any) -> None:
    items = [b"ab", b"", b"xyz"]
    blob = b"".join(struct.pack("<I", len(i)) + i for i in items)
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "BYTES",
                    "shape": [1, 3],
                    "parameters": {"binary_data_size": len(blob)},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    )
    status, headers, body = post(
        server,
        "/v2/models/identity_bytes/infer",
        header + blob,
        {"Inference-Header-Content-Length": str(len(header))},
    )
    assert status == 200
    json_size = int(headers["inference-header-content-length"])
    assert body[json_size:] == blob


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_request_and_response(server: Any, encoding: str) -> None:
    raw = orjson.dumps(SIMPLE_JSON)
    compressed = gzip.compress(raw) if encoding == "gzip" else zlib.compress(raw)
    status, headers, body = post(
        server,
        "/v2/models/simple/infer",
        compressed,
        {"Content-Encoding": encoding, "Accept-Encoding": encoding},
    )
    assert status == 200
    assert headers["content-encoding"] == encoding
    plain = gzip.decompress(body) if encoding == "gzip" else zlib.decompress(body)
    assert orjson.loads(plain)["outputs"][0]["data"][0] == 1


def test_tritonclient_compression(server: Any) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    inputs, a, b = simple_inputs()
    result = client.infer(
        "simple",
        inputs,
        request_compression_algorithm="gzip",
        response_compression_algorithm="deflate",
    )
    assert np.array_equal(result.as_numpy("OUTPUT0"), a + b)


def test_asyncio_client_concurrent_requests(server: Any) -> None:
    async def run() -> list[np.ndarray]:
        client = aiohttpclient.InferenceServerClient(server.http_url)
        try:

            async def one(i: int) -> np.ndarray:
                data = np.full((1, 16), i, dtype=np.int32)
                inputs = []
                for name in ("INPUT0", "INPUT1"):
                    tensor = aiohttpclient.InferInput(name, [1, 16], "INT32")
                    tensor.set_data_from_numpy(data)
                    inputs.append(tensor)
                result = await client.infer("simple_dyna", inputs)
                return result.as_numpy("OUTPUT0")

            return await asyncio.gather(*(one(i) for i in range(32)))
        finally:
            await client.close()

    outputs = asyncio.run(run())
    for i, output in enumerate(outputs):
        assert np.array_equal(output, np.full((1, 16), 2 * i, dtype=np.int32))


def test_batch_of_several_rows(server: Any) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    data = np.arange(5 * 16, dtype=np.int32).reshape(5, 16)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [5, 16], "INT32")
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    result = client.infer("simple", inputs)
    assert np.array_equal(result.as_numpy("OUTPUT0"), data * 2)
