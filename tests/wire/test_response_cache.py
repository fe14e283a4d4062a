"""Triton's response cache (`--cache-config local,size=N`, `response_cache { enable: true }`)
on real servers with tritonclient: hits over HTTP and gRPC, the /metrics families, the flags. The
cache's rules (keys, eviction, sizes, ensembles, decoupled models) are tested in process:
tests/core/test_response_cache_rules.py."""

from __future__ import annotations

import http.client
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from oceanus.cli import parse_args
from oceanus.examples import example_repository

CACHE_ON = "\nresponse_cache { enable: true }\n"


@pytest.fixture(scope="module")
def cache_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`simple` with the cache enabled, and `simple_nocache`, the same model without it."""
    source = example_repository(["simple"]) / "simple"
    root = tmp_path_factory.mktemp("cache-repo")
    shutil.copytree(source, root / "simple")
    config = root / "simple" / "config.pbtxt"
    config.write_text(config.read_text() + CACHE_ON)
    shutil.copytree(source, root / "simple_nocache")
    config = root / "simple_nocache" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "simple"', 'name: "simple_nocache"'))
    return root


@pytest.fixture(scope="module")
def cache_server(cache_repository: Path, launch_module: Any) -> Any:
    return launch_module([cache_repository], ["--cache-config", "local,size=1048576"])


def _inputs(module: Any, offset: int) -> list[Any]:
    a = np.arange(16, dtype=np.int32).reshape(1, 16) + offset
    b = np.ones((1, 16), dtype=np.int32)
    inputs = [
        module.InferInput("INPUT0", [1, 16], "INT32"),
        module.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def _infer(server: Any, model: str, offset: int, request_id: str = "") -> Any:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        return client.infer(model, _inputs(httpclient, offset), request_id=request_id)
    finally:
        client.close()


def _stats(server: Any, model: str) -> dict[str, Any]:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        return client.get_inference_statistics(model)["model_stats"][0]  # type: ignore[no-any-return]
    finally:
        client.close()


def _metrics(server: Any) -> str:
    connection = http.client.HTTPConnection("127.0.0.1", server.metrics_port, timeout=10)
    connection.request("GET", "/metrics")
    return connection.getresponse().read().decode()


def _counts(stats: dict[str, Any]) -> tuple[int, int, int]:
    inference = stats["inference_stats"]
    return (
        inference["cache_hit"]["count"],
        inference["cache_miss"]["count"],
        stats["execution_count"],
    )


def test_repeated_requests_hit_and_skip_execution(cache_server: Any) -> None:
    first = _infer(cache_server, "simple", 100, "first")
    second = _infer(cache_server, "simple", 100, "second")
    assert second.get_response()["id"] == "second"
    for name in ("OUTPUT0", "OUTPUT1"):
        np.testing.assert_array_equal(first.as_numpy(name), second.as_numpy(name))
    expected = np.arange(16, dtype=np.int32).reshape(1, 16) + 101
    np.testing.assert_array_equal(second.as_numpy("OUTPUT0"), expected)
    # gRPC reads the same cache.
    client = grpcclient.InferenceServerClient(cache_server.grpc_url)
    try:
        third = client.infer("simple", _inputs(grpcclient, 100), request_id="third")
    finally:
        client.close()
    assert third.get_response().id == "third"
    np.testing.assert_array_equal(third.as_numpy("OUTPUT0"), expected)

    stats = _stats(cache_server, "simple")
    assert _counts(stats) == (2, 1, 1)
    inference = stats["inference_stats"]
    assert inference["success"]["count"] == 3
    assert inference["compute_infer"]["count"] == 1
    assert stats["inference_count"] == 1
    assert inference["cache_hit"]["ns"] > 0 and inference["cache_miss"]["ns"] > 0

    # A different input misses, runs, and is then a hit itself.
    _infer(cache_server, "simple", 200)
    assert _counts(_stats(cache_server, "simple")) == (2, 2, 2)
    _infer(cache_server, "simple", 200)
    assert _counts(_stats(cache_server, "simple")) == (3, 2, 2)


def test_model_without_response_cache_never_caches(cache_server: Any) -> None:
    for _ in range(3):
        _infer(cache_server, "simple_nocache", 7)
    assert _counts(_stats(cache_server, "simple_nocache")) == (0, 0, 3)


def test_requested_outputs_are_part_of_the_key(cache_server: Any) -> None:
    client = httpclient.InferenceServerClient(cache_server.http_url)
    try:
        outputs = [httpclient.InferRequestedOutput("OUTPUT1")]
        before = _counts(_stats(cache_server, "simple"))
        one = client.infer("simple", _inputs(httpclient, 300), outputs=outputs)
        both = client.infer("simple", _inputs(httpclient, 300))
        again = client.infer("simple", _inputs(httpclient, 300), outputs=outputs)
    finally:
        client.close()
    assert one.as_numpy("OUTPUT0") is None and one.as_numpy("OUTPUT1") is not None
    assert both.as_numpy("OUTPUT0") is not None
    assert again.as_numpy("OUTPUT0") is None
    after = _counts(_stats(cache_server, "simple"))
    assert (after[0] - before[0], after[1] - before[1]) == (1, 2)


def test_cache_metrics_families(cache_server: Any) -> None:
    _infer(cache_server, "simple", 400)
    _infer(cache_server, "simple", 400)
    stats = _stats(cache_server, "simple")
    text = _metrics(cache_server)
    labels = '{model="simple",version="1"}'
    inference = stats["inference_stats"]
    assert "# TYPE nv_cache_num_hits_per_model counter" in text
    assert "# HELP nv_cache_num_hits_per_model Number of cache hits per model" in text
    assert f"nv_cache_num_hits_per_model{labels} {inference['cache_hit']['count']}\n" in text
    assert f"nv_cache_num_misses_per_model{labels} {inference['cache_miss']['count']}\n" in text
    hit_us = inference["cache_hit"]["ns"] // 1000
    miss_us = inference["cache_miss"]["ns"] // 1000
    assert f"nv_cache_hit_duration_per_model{labels} {hit_us}\n" in text
    assert f"nv_cache_miss_duration_per_model{labels} {miss_us}\n" in text
    # Cache hits are successes but not inferences or executions.
    assert f"nv_inference_request_success{labels} {inference['success']['count']}\n" in text
    assert f"nv_inference_exec_count{labels} {stats['execution_count']}\n" in text
    # Only models that use the cache get the families.
    assert 'nv_cache_num_hits_per_model{model="simple_nocache"' not in text


def test_model_enabling_the_cache_without_a_server_cache_warns(
    cache_repository: Path, launch: Any
) -> None:
    server = launch([cache_repository])
    _infer(server, "simple", 5)
    _infer(server, "simple", 5)
    assert _counts(_stats(server, "simple")) == (0, 0, 2)
    assert "response cache is not configured" in server.log()
    assert "nv_cache_num_hits_per_model" not in _metrics(server)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--cache-config", "local"], "--cache-config expects"),
        (["--cache-config", "local,size=lots"], "invalid cache size"),
        (["--cache-config", "local,size=10", "--response-cache-byte-size", "10"], "Incompatible"),
    ],
)
def test_bad_cache_flags_exit_2(
    args: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(args)
    assert exited.value.code == 2
    assert words in capsys.readouterr().err


def test_the_deprecated_byte_size_flag_enables_the_local_cache(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Read at the `oceanus` logger itself: an in-process server earlier in the session may have
    # given it its own handler and stopped propagation to the root, where caplog listens.
    logger = logging.getLogger("oceanus")
    logger.addHandler(caplog.handler)
    try:
        settings, _ = parse_args(["--response-cache-byte-size=1048576"])
    finally:
        logger.removeHandler(caplog.handler)
    assert settings.response_cache_size == 1048576
    assert "--response-cache-byte-size is deprecated" in caplog.text
