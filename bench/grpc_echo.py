"""The floor of gRPC in Python: a server that answers `simple`'s ModelInfer with a precomputed
response and does nothing else, in one or more processes sharing the port, on either transport:
Oceanus's h2 one (oceanus/frontends/grpc_transport/server.py, the default) or grpc.aio.

Whatever Oceanus does per request comes on top of this; bench/workers.py runs it beside Oceanus
so the ratio of the two shows how much of the gRPC cost is the transport's own.

    python bench/grpc_echo.py --port 8001 --processes 2 [--transport grpcio]  # until interrupted
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb

from oceanus.frontends.grpc.server import MAX_MESSAGE_SIZE, GrpcOptions
from oceanus.frontends.grpc_transport.server import H2Server, Limits
from oceanus.main import install_uvloop

SERVICE = "inference.GRPCInferenceService"


def _responses() -> dict[str, bytes]:
    metadata = pb.ModelMetadataResponse(name="simple", versions=["1"], platform="onnxruntime_onnx")
    config = mc.ModelConfig(name="simple", platform="onnxruntime_onnx", max_batch_size=8)
    for names, target, config_target in (
        (("INPUT0", "INPUT1"), metadata.inputs, config.input),
        (("OUTPUT0", "OUTPUT1"), metadata.outputs, config.output),
    ):
        for name in names:
            target.add(name=name, datatype="INT32", shape=[-1, 16])
            config_target.add(name=name, data_type=mc.TYPE_INT32, dims=[16])
    infer = pb.ModelInferResponse(model_name="simple", model_version="1")
    for name in ("OUTPUT0", "OUTPUT1"):
        infer.outputs.add(name=name, datatype="INT32", shape=[1, 16])
        infer.raw_output_contents.append(np.arange(16, dtype=np.int32).tobytes())
    return {
        "ServerMetadata": pb.ServerMetadataResponse(name="echo", version="0").SerializeToString(),
        "ServerLive": pb.ServerLiveResponse(live=True).SerializeToString(),
        "ServerReady": pb.ServerReadyResponse(ready=True).SerializeToString(),
        "ModelReady": pb.ModelReadyResponse(ready=True).SerializeToString(),
        "ModelMetadata": metadata.SerializeToString(),
        "ModelConfig": pb.ModelConfigResponse(config=config).SerializeToString(),
        "ModelInfer": infer.SerializeToString(),
    }


async def serve(port: int, transport: str) -> None:
    answers = _responses()

    def unary(answer: bytes) -> Any:
        async def handler(request: bytes, context: Any) -> bytes:
            return answer

        return grpc.unary_unary_rpc_method_handler(handler)

    handlers = {method: unary(answer) for method, answer in answers.items()}
    server: Any
    if transport == "h2":
        paths = {f"/{SERVICE}/{method}".encode(): h for method, h in handlers.items()}
        server = H2Server(paths, Limits(GrpcOptions(), MAX_MESSAGE_SIZE))
        await server.start("127.0.0.1", port, reuse_port=True, ssl_context=None)
    else:
        server = grpc.aio.server(options=[("grpc.so_reuseport", 1)])
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop(None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--transport", choices=("h2", "grpcio"), default="h2")
    args = parser.parse_args()
    install_uvloop()  # as the server runs
    children = []
    for _ in range(args.processes - 1):
        pid = os.fork()
        if pid == 0:
            asyncio.run(serve(args.port, args.transport))
            os._exit(0)
        children.append(pid)
    try:
        asyncio.run(serve(args.port, args.transport))
    finally:
        for pid in children:
            os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
