"""Hostile HTTP: malformed and oversized requests get a clear 4xx in the protocol's form, never
a 5xx or a hang, and the server answers a correct request after each (issue 18).

One server for the module; raw sockets where a client library would refuse to send the bytes.
"""

from __future__ import annotations

import asyncio
import gzip
import http.client
import json
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from oceanus.core.tensor_bytes import MAX_BYTES_ELEMENTS
from oceanus.frontends.http import protocol
from oceanus.frontends.http.protocol import HttpRequest, HttpResponse, HttpServer


@pytest.fixture(scope="module")
def server(model_repository: Any, launch_module: Any) -> Any:
    return launch_module([model_repository])


def _simple(value: int = 1) -> bytes:
    data = [value] * 16
    return json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": data},
                {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": data},
            ]
        }
    ).encode()


def raw(port: int, data: bytes, read_until_close: bool = True, timeout: float = 10.0) -> bytes:
    """Send bytes as they are; everything the server answers until it closes (or timeout)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            chunks.append(chunk)
            if not read_until_close:
                break
        return b"".join(chunks)


def post(path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: x", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\nConnection: close\r\n\r\n").encode() + body


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def body_of(answer: bytes) -> dict[str, Any]:
    return json.loads(answer.split(b"\r\n\r\n", 1)[1] or b"{}")


@pytest.fixture(autouse=True)
def still_serving(server: Any) -> Iterator[None]:
    """After every hostile case the server answers a correct request."""
    yield
    answer = raw(server.http_port, post("/v2/models/simple/infer", _simple(3)))
    assert status_of(answer) == 200, answer[:300]
    assert body_of(answer)["outputs"][0]["data"][0] == 6


@pytest.mark.parametrize("depth", [100, 1000, 100_000])
def test_deeply_nested_json_is_a_400(server: Any, depth: int) -> None:
    nested = "[" * depth + "1" + "]" * depth
    head = '{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1,16],"data":'
    body = (head + nested + "}]}").encode()
    answer = raw(server.http_port, post("/v2/models/simple/infer", body))
    assert status_of(answer) == 400, answer[:300]
    assert body_of(answer)["error"]


@pytest.mark.parametrize(
    ("shape", "data", "words"),
    [
        ([2**62], [1.0], "Shape does not match"),
        ([-1, 16], [1.0] * 16, "non-unsigned-integer"),
        ([0, 16], [], "input byte size mismatch"),  # Triton 2.51's answer to a batch of 0
        ([1, 16], ["NaN"] * 16, "non-double"),
    ],
)
def test_impossible_shapes_and_values_are_400s(
    server: Any, shape: list[int], data: list[Any], words: str
) -> None:
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": shape, "data": data}]}
    ).encode()
    answer = raw(server.http_port, post("/v2/models/identity_fp32/infer", body))
    assert status_of(answer) == 400, answer[:300]
    assert words in body_of(answer)["error"]


def test_nan_literals_are_a_400(server: Any) -> None:
    body = b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,1],"data":[NaN]}]}'
    answer = raw(server.http_port, post("/v2/models/identity_fp32/infer", body))
    assert status_of(answer) == 400
    assert "failed to parse the request JSON buffer" in body_of(answer)["error"]


def _one_binary_string(server: Any, binary_data_size: int, data: bytes) -> bytes:
    """identity_bytes with one BYTES element whose header claims `binary_data_size` bytes."""
    parameters = {"binary_data_size": binary_data_size}
    tensor = {"name": "INPUT0", "datatype": "BYTES", "shape": [1, 1], "parameters": parameters}
    header = json.dumps({"inputs": [tensor]}).encode()
    lengths = {"Inference-Header-Content-Length": str(len(header))}
    return raw(server.http_port, post("/v2/models/identity_bytes/infer", header + data, lengths))


def test_binary_headers_that_lie_about_lengths_are_400s(server: Any) -> None:
    answer = _one_binary_string(server, 1000, struct.pack("<I", 3) + b"abc")
    assert status_of(answer) == 400
    assert "expecting" in body_of(answer)["error"]
    # A BYTES element whose length runs past the end of its tensor.
    answer = _one_binary_string(server, 8, struct.pack("<I", 100) + b"abcd")
    assert status_of(answer) == 400
    assert "incomplete string data" in body_of(answer)["error"]


def test_too_many_headers_are_a_431(server: Any) -> None:
    headers = "".join(f"X-{n}: {n}\r\n" for n in range(protocol.MAX_HEADERS + 5))
    request = f"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode()
    answer = raw(server.http_port, request)
    assert status_of(answer) == 431


def test_a_huge_header_is_refused_before_it_is_all_read(server: Any) -> None:
    """The head stops being buffered at the limit: the answer comes while the client is still
    sending its 32 MiB header value."""
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Big: ")
        sent = 0
        answer = b""
        sock.settimeout(0.05)
        while sent < 32 << 20 and not answer:
            try:
                sock.sendall(b"a" * 65536)
                sent += 65536
                answer = sock.recv(4096)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
        if not answer:
            sock.settimeout(5)
            answer = sock.recv(4096)
    assert status_of(answer) == 431
    assert sent < 1 << 20  # refused within the first MiB


def test_a_long_url_is_a_414(server: Any) -> None:
    path = "/v2/models/" + "m" * (protocol.MAX_URL_BYTES + 10)
    answer = raw(server.http_port, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert status_of(answer) == 414


@pytest.mark.parametrize(
    "head",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /v2/health/live HTTP/9.9\r\n\r\n",
        b"GET /v2/health/live HTTP/1.1\r\nBad Header\r\n\r\n",
        # Both lengths: a request smuggler's favourite; refused, never guessed.
        b"POST /v2/health/live HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"POST /v2/health/live HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nContent-Length: 5\r\n"
        b"\r\nabcde",
    ],
)
def test_malformed_requests_are_400s(server: Any, head: bytes) -> None:
    answer = raw(server.http_port, head)
    assert status_of(answer) == 400, answer[:200]


def test_pipelined_requests_are_answered_in_order(server: Any) -> None:
    one = post("/v2/models/simple/infer", _simple(1)).replace(b"Connection: close\r\n", b"")
    two = post("/v2/models/simple/infer", _simple(2)).replace(b"Connection: close\r\n", b"")
    three = post("/v2/models/simple/infer", _simple(5))
    answer = raw(server.http_port, one + two + three)
    values = [
        json.loads(part.split(b"\r\n\r\n", 1)[1].split(b"HTTP/1.1", 1)[0])["outputs"][0]["data"][0]
        for part in answer.split(b"HTTP/1.1 200 OK")[1:]
    ]
    assert values == [2, 4, 10]


def test_a_body_over_the_limit_is_refused_before_it_is_sent(server: Any) -> None:
    """The answer comes from the headers alone (a 64 MiB default limit; a client announcing
    100 MiB need not send them)."""
    size = 100 << 20
    head = (
        f"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n"
    ).encode()
    answer = raw(server.http_port, head, read_until_close=False)
    assert status_of(answer) == 400
    assert b"connection: close" in answer.lower()
    assert b"exceeds the maximum allowed value" in answer


def test_a_compression_bomb_is_bounded(server: Any) -> None:
    bomb = gzip.compress(b"[" + b"0," * (40 << 20) + b"0]", compresslevel=9)
    assert len(bomb) < 1 << 20
    answer = raw(
        server.http_port,
        post("/v2/models/simple/infer", bomb, {"Content-Encoding": "gzip"}),
    )
    assert status_of(answer) == 400
    assert "exceeds the maximum allowed value" in body_of(answer)["error"]


def test_a_slow_head_is_timed_out() -> None:
    """Slow-loris: a head that trickles in is answered 408 after its deadline (a short one
    here, on an in-process server)."""

    async def run() -> bytes:
        def handle(request: HttpRequest) -> HttpResponse:
            return HttpResponse(200, b"{}")

        previous = protocol.HEAD_TIMEOUT_S
        protocol.HEAD_TIMEOUT_S = 0.3
        server = HttpServer(handle, 1 << 20)
        await server.start("127.0.0.1", 0)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"GET /v2/health/live HTTP/1.1\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"Host: x\r\n")  # a second read: the head now has a deadline
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            return answer
        finally:
            protocol.HEAD_TIMEOUT_S = previous
            await server.stop(1)

    answer = asyncio.run(run())
    assert status_of(answer) == 408


def test_a_big_body_is_decoded_while_other_requests_are_served(server: Any) -> None:
    """Millions of BYTES elements take seconds to turn into arrays; that happens on a thread,
    so a health probe sent meanwhile is answered before the big request is."""
    count = MAX_BYTES_ELEMENTS  # per input: four inputs at the limit
    names = ("INPUT0", "INPUT1", "INPUT2", "INPUT3")
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "datatype": "BYTES",
                    "shape": [1, count],
                    "parameters": {"binary_data_size": 4 * count},
                }
                for name in names
            ]
        }
    ).encode()
    body = header + b"\x00\x00\x00\x00" * count * len(names)
    big = socket.create_connection(("127.0.0.1", server.http_port), timeout=60)
    big.sendall(
        post(
            "/v2/models/simple/infer",
            body,
            {"Inference-Header-Content-Length": str(len(header))},
        )
    )
    try:
        probe = raw(server.http_port, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n", False, 30)
        assert status_of(probe) == 200
        big.setblocking(False)
        with pytest.raises(BlockingIOError):  # the big request is still being decoded
            big.recv(1)
        big.setblocking(True)
        answer = big.recv(65536)
        assert status_of(answer) == 400  # four inputs where the model takes two
    finally:
        big.close()


def test_millions_of_empty_strings_are_refused_before_decoding(server: Any) -> None:
    """4 M empty BYTES elements (a 16 MiB body) used to cost seconds and ~300 MB: the shape says
    the count, over the limit it is a 400 before one element is decoded (bench/hostile: <0.5 s)."""
    count = 4_000_000
    for shape in ([1, count], [1, 1]):  # as declared, and a shape that lies about the count
        tensor = {
            "name": "INPUT0",
            "datatype": "BYTES",
            "shape": shape,
            "parameters": {"binary_data_size": 4 * count},
        }
        header = json.dumps({"inputs": [tensor]}).encode()
        lengths = {"Inference-Header-Content-Length": str(len(header))}
        body = header + b"\x00\x00\x00\x00" * count
        answer = raw(server.http_port, post("/v2/models/identity_bytes/infer", body, lengths))
        assert status_of(answer) == 400
        error = body_of(answer)["error"]
        if shape[1] == count:
            assert f"has {count} string elements, more than the {MAX_BYTES_ELEMENTS}" in error
        else:
            assert "expected 1 string elements for inference input 'INPUT0'" in error
    # The same in JSON: refused from the shape (or the list's length) before any is converted.
    data = b",".join([b'""'] * count)
    for shape in ([1, count], [1, 1]):
        tensor = json.dumps({"name": "INPUT0", "datatype": "BYTES", "shape": shape})
        body = b'{"inputs":[' + tensor[:-1].encode() + b',"data":[' + data + b"]}]}"
        answer = raw(server.http_port, post("/v2/models/identity_bytes/infer", body))
        assert status_of(answer) == 400
        assert "string elements, more than the" in body_of(answer)["error"]
    assert status_of(raw(server.http_port, post("/v2/models/simple/infer", _simple()))) == 200


def test_body_over_max_input_size(model_repository: Any, launch: Any) -> None:
    server = launch([model_repository], ["--http-max-input-size=1000", "--allow-grpc=false"])
    big = orjson.dumps(_simple_request()) + b" " * 2000
    status, _, answer = _post(server, "/v2/models/simple/infer", big)
    assert status == 400
    assert "exceeds the maximum allowed value of 1000 bytes" in answer["error"]
    # a gzip bomb is refused the same way, after decompressing at most the limit
    status, _, answer = _post(
        server, "/v2/models/simple/infer", gzip.compress(big), {"Content-Encoding": "gzip"}
    )
    assert status == 400
    assert "exceeds the maximum allowed value of 1000 bytes" in answer["error"]


def test_server_keeps_serving_after_errors(server: Any) -> None:
    for _ in range(3):
        _post(server, "/v2/models/simple/infer", b"{broken")
    status, _, answer = _post(server, "/v2/models/simple/infer", orjson.dumps(_simple_request()))
    assert status == 200
    assert answer["outputs"][0]["data"][0] == 1


def _simple_request() -> dict[str, Any]:
    data = list(range(16))
    return {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": data},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
        ]
    }


def _post(
    server: Any, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], dict[str, Any]]:
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    connection.request("POST", path, body=body, headers=headers or {})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, orjson.loads(data)


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        (gzip.compress(b"\0" * (8 << 20)), {"Content-Encoding": "gzip"}),
        (b"\0" * (2 << 20), {}),
        (b"\0" * (2 << 20), {"Inference-Header-Content-Length": str(2 << 20)}),
    ],
    ids=["8 MiB of gzip zeros", "2 MiB of zeros", "2 MiB of zeros as a binary header"],
)
def test_the_grpc_hostile_payloads_cost_little_over_http(
    server: Any, body: bytes, headers: dict[str, str]
) -> None:
    """Issue 42's gRPC payloads, over HTTP: refused quickly (a compressed body over 4 KiB is
    inflated off the event loop), and the server serves on."""
    started = time.monotonic()
    answer = raw(server.http_port, post("/v2/models/simple/infer", body, headers))
    assert time.monotonic() - started < 2
    assert status_of(answer) == 400
    assert status_of(raw(server.http_port, post("/v2/models/simple/infer", _simple()))) == 200
