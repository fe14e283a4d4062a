"""`--http-restricted-api`: API groups that need a header, answered as the reference Triton 2.51
answers (403 `This API is restricted, expecting header '<key>'`, checked before the method)."""

from __future__ import annotations

import http.client
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from oceanus.examples import example_repository

BODY = orjson.dumps(
    {
        "inputs": [
            {"name": n, "datatype": "INT32", "shape": [1, 16], "data": [1] * 16}
            for n in ("INPUT0", "INPUT1")
        ]
    }
)


def call(
    server: Any, method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b""
) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    connection.request(method, path, body=body or None, headers=headers or {})
    response = connection.getresponse()
    payload = response.read()
    connection.close()
    return response.status, orjson.loads(payload) if payload else None


@pytest.fixture(scope="module")
def restricted(launch_module: Any) -> Any:
    return launch_module(
        [example_repository(["simple"])],
        [
            "--http-restricted-api=model-repository,trace:admin-key=secret",
            "--http-restricted-api=metadata,inference:infer-key=v",
            "--allow-metrics=false",
        ],
    )


@pytest.mark.parametrize(
    ("method", "path", "header"),
    [
        ("POST", "/v2/repository/index", "admin-key"),
        ("GET", "/v2/trace/setting", "admin-key"),
        ("GET", "/v2/models/simple/trace/setting", "admin-key"),
        ("GET", "/v2", "infer-key"),
        ("GET", "/v2/models/simple", "infer-key"),
        ("GET", "/v2/models/simple/versions/1", "infer-key"),
        ("POST", "/v2/models/simple/infer", "infer-key"),
        ("PUT", "/v2/models/simple/infer", "infer-key"),  # before the method check
        ("POST", "/v2/models/nope/infer", "infer-key"),  # before the model lookup
    ],
)
def test_restricted_without_the_header(
    restricted: Any, method: str, path: str, header: str
) -> None:
    expected = {"error": f"This API is restricted, expecting header '{header}'"}
    assert call(restricted, method, path) == (403, expected)
    assert call(restricted, method, path, {header: "wrong"}) == (403, expected)


def test_with_the_header_and_unrestricted_groups(restricted: Any) -> None:
    status, index = call(restricted, "POST", "/v2/repository/index", {"Admin-Key": "secret"})
    assert status == 200 and index[0]["name"] == "simple"
    status, answer = call(restricted, "POST", "/v2/models/simple/infer", {"infer-key": "v"}, BODY)
    assert status == 200 and answer["outputs"][0]["data"] == [2] * 16
    assert call(restricted, "GET", "/v2/health/ready")[0] == 200
    assert call(restricted, "GET", "/v2/models/simple/config")[0] == 200
    assert call(restricted, "GET", "/v2/models/simple/stats")[0] == 200


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("bogus:a=b", "unknown restricted api 'bogus'"),
        ("health", "--http-restricted-api option format is '<config name>:<setting>=<value>'."),
        (
            "health:a=b --http-restricted-api=health:c=d",
            "restricted api 'health' can not be specified in multiple config groups",
        ),
    ],
)
def test_bad_flag_exits(value: str, message: str, tmp_path: Path) -> None:
    flags = [f"--http-restricted-api={part}" for part in value.split(" --http-restricted-api=")]
    result = subprocess.run(
        [sys.executable, "-m", "oceanus", *flags], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert message in result.stderr
