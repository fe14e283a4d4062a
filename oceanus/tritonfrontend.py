"""NVIDIA's `tritonfrontend` under its own names: HTTP, gRPC and metrics services attached to
a running in-process server (`KServeHttp(server, KServeHttp.Options(port=8000))`, `start()`,
`stop()`, `with`). See docs/embedded.md."""

from oceanus.embedded.frontends import KServeGrpc, KServeHttp, Metrics

__all__ = ["KServeGrpc", "KServeHttp", "Metrics"]
