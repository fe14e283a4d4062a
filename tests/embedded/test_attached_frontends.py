"""Frontends attached to a running in-process server, as `tritonfrontend` attaches them: Triton's
own clients over HTTP and gRPC, and the metrics endpoint, then the ports closed again."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

import oceanus.tritonserver as tritonserver
from oceanus.tritonfrontend import KServeGrpc, KServeHttp, Metrics


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _infer(client: object, module: object) -> list[int]:
    data = np.arange(16, dtype=np.int32).reshape(1, 16)
    make = module.InferInput  # type: ignore[attr-defined]
    inputs = [make("INPUT0", [1, 16], "INT32"), make("INPUT1", [1, 16], "INT32")]
    for item in inputs:
        item.set_data_from_numpy(data)
    result = client.infer("simple", inputs)  # type: ignore[attr-defined]
    return [int(v) for v in result.as_numpy("OUTPUT0")[0, :3]]


def test_http_grpc_and_metrics_on_an_embedded_server(embedded_repository: Path) -> None:
    server = tritonserver.Server(model_repository=str(embedded_repository)).start(
        wait_until_ready=True
    )
    http_port, grpc_port, metrics_port = _free_port(), _free_port(), _free_port()
    try:
        with KServeHttp(server, KServeHttp.Options(address="127.0.0.1", port=http_port)):
            client = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
            assert client.is_server_ready() and client.is_model_ready("simple")
            assert _infer(client, httpclient) == [0, 2, 4]
            # The in-process API and the wire share one core: one statistics source.
            stats = client.get_inference_statistics("simple")["model_stats"][0]
            assert stats["inference_count"] == 1
            client.close()
        grpc_service = KServeGrpc.Server(  # tritonfrontend's first spelling
            server, KServeGrpc.Options(address="127.0.0.1", port=grpc_port)
        )
        grpc_service.start()
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        assert _infer(client, grpcclient) == [0, 2, 4]
        client.close()
        metrics = Metrics(server, Metrics.Options(address="127.0.0.1", port=metrics_port))
        metrics.start()
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        assert 'nv_inference_request_success{model="simple",version="1"} 2' in text
    finally:
        server.stop()  # stops the services still attached (gRPC, metrics)
    for port in (http_port, grpc_port, metrics_port):
        with socket.socket() as sock:  # nothing listens any more
            assert sock.connect_ex(("127.0.0.1", port)) != 0


def test_http_routes_without_a_socket(embedded_repository: Path) -> None:
    # What a Ray Serve replica hands its requests to (oceanus/ray_serve.py): the HTTP
    # frontend's own answers, status and body.
    import asyncio
    import json

    from oceanus.embedded.http_handler import HttpHandler

    with tritonserver.Server(model_repository=str(embedded_repository)) as server:
        handler = HttpHandler(server)
        body = json.dumps(
            {
                "inputs": [
                    {"name": n, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
                    for n in ("INPUT0", "INPUT1")
                ]
            }
        ).encode()

        async def scenario() -> None:
            status, _, _ = await handler("GET", "/v2/health/ready", {}, b"")
            assert status == 200
            status, headers, answer = await handler(
                "POST", "/v2/models/simple/infer", {b"content-type": b"application/json"}, body
            )
            assert status == 200 and (b"content-type", b"application/json") in headers
            outputs = {o["name"]: o["data"] for o in json.loads(answer)["outputs"]}
            assert outputs["OUTPUT0"][:3] == [0, 2, 4]
            status, _, answer = await handler("GET", "/v2/models/nope", {}, b"")
            assert status == 404 and b"Request for unknown model" in answer

        asyncio.run(scenario())
