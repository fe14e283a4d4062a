"""Frontend workers (`--frontend-workers 1`) take hostile bodies with the in-process frontends'
bounds (issue 42): compressed zeros inflated off the loop and within the size limit, messages
naming thousands of tensors decoded on a thread; the worker keeps serving beside them."""

from __future__ import annotations

import gzip
import http.client
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from oceanus.examples import example_repository
from oceanus.frontends.grpc_transport.call import MAX_DETAILS
from oceanus.frontends.http.infer import decode_on_loop
from oceanus.frontends.http.protocol import HttpRequest

sys.path.insert(0, str(Path(__file__).parent / "grpc"))
from grpc_testlib import many_inputs_request, raw_infer, simple_request

ZEROS = b"\0" * (8 << 20)  # 8 KiB of gzip


@pytest.mark.parametrize(
    ("body", "encoding", "on_loop"),
    [
        (gzip.compress(b"{}"), b"gzip", True),  # small: inflated at once
        (gzip.compress(ZEROS), b"gzip", False),  # 8 KiB of gzip: a thread inflates it
        (gzip.compress(ZEROS), b" Identity ", True),  # not compressed after all
        (b"{" + b" " * (2 << 20) + b"}", None, False),  # 2 MiB: a thread decodes it
    ],
)
def test_the_workers_and_the_in_process_frontend_keep_the_same_bodies_off_the_loop(
    body: bytes, encoding: bytes | None, on_loop: bool
) -> None:
    """One rule (http/infer.py `decode_on_loop`) for app.py and workers/handlers.py."""
    headers = {b"content-encoding": encoding} if encoding else {}
    assert decode_on_loop(HttpRequest("POST", "/v2/models/m/infer", headers, body)) is on_loop


@pytest.fixture(scope="module")
def server(launch_module: Any) -> Any:
    return launch_module([example_repository(["simple"])], ["--frontend-workers=1"])


@pytest.fixture(scope="module")
def channel(server: Any) -> Any:
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        yield channel


class _Beside:
    """A legitimate client calling `simple` in a loop while the test runs: every answer right."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._channel = channel
        self._stop = threading.Event()
        self.answers: list[Any] = []
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.answers.append(raw_infer(self._channel, simple_request()))

    def __enter__(self) -> _Beside:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        assert self.answers
        assert all(isinstance(answer, bytes) for answer in self.answers), self.answers[:3]


@pytest.mark.parametrize(
    ("payload", "compression", "code"),
    [
        (ZEROS, grpc.Compression.Gzip, grpc.StatusCode.INVALID_ARGUMENT),
        (b"\0" * (2 << 20), None, grpc.StatusCode.INVALID_ARGUMENT),
        (many_inputs_request(), None, grpc.StatusCode.INVALID_ARGUMENT),
    ],
    ids=["8 KiB of gzip of 8 MiB of zeros", "2 MiB of zeros", "60,000 empty inputs"],
)
def test_hostile_grpc_bodies_are_refused_quickly_through_a_worker(
    channel: grpc.Channel, payload: bytes, compression: Any, code: grpc.StatusCode
) -> None:
    with _Beside(channel):
        started = time.monotonic()
        answer = raw_infer(channel, payload, compression=compression)
        assert time.monotonic() - started < 2
    assert isinstance(answer, grpc.RpcError)
    assert answer.code() == code
    assert len(answer.details()) <= MAX_DETAILS


def test_a_gzip_bomb_over_http_is_refused_quickly_through_a_worker(
    server: Any, channel: grpc.Channel
) -> None:
    body = gzip.compress(ZEROS)
    assert len(body) < 9 << 10
    with _Beside(channel):
        connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
        started = time.monotonic()
        connection.request(
            "POST",
            "/v2/models/simple/infer",
            body,
            {"Content-Type": "application/json", "Content-Encoding": "gzip"},
        )
        response = connection.getresponse()
        assert time.monotonic() - started < 2
    assert response.status == 400
    assert "error" in json.loads(response.read())
    connection.close()
