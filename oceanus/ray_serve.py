"""Oceanus on Ray Serve (deploy/ray/, docs/ray.md): each replica runs an in-process server on
the shared repository and answers the KServe v2 HTTP routes that reach it through Ray Serve's
HTTP proxy unchanged, so tritonclient and perf_analyzer work against the proxy's address.

`serve run deploy/ray/serve_config.yaml` (or `serve deploy`) builds the application with
`build({"model_repository": ..., "server_options": {...}})`; replica count, autoscaling and
placement are Serve's deployment options, set in that file.
"""

from __future__ import annotations

import logging
from typing import Any

from ray import serve
from ray.serve import Application
from starlette.requests import Request
from starlette.responses import Response

from oceanus.embedded.http_handler import HttpHandler
from oceanus.embedded.server import Server

log = logging.getLogger("oceanus.ray")


@serve.deployment(
    name="oceanus",
    # Requests one replica takes at once; the autoscaler aims at `target_ongoing_requests`.
    max_ongoing_requests=64,
    autoscaling_config={
        "min_replicas": 1,
        "max_replicas": 4,
        "target_ongoing_requests": 8,
        "upscale_delay_s": 5,
        "downscale_delay_s": 60,
    },
    # Serve calls check_health (the server's readiness) this often; a replica that fails it is
    # replaced and gets no traffic meanwhile.
    health_check_period_s=2,
    health_check_timeout_s=10,
    ray_actor_options={"num_cpus": 1},
)
class OceanusReplica:
    def __init__(self, model_repository: str | list[str], server_options: dict[str, Any]) -> None:
        options = dict(server_options)
        options.setdefault("model_repository", model_repository)
        self.server = Server(**options).start(wait_until_ready=True)
        self.http = HttpHandler(self.server)

    async def __call__(self, request: Request) -> Response:
        headers = {name.lower(): value for name, value in request.headers.raw}
        body = await request.body()
        status, answer_headers, answer = await self.http(
            request.method, request.url.path, headers, body
        )
        return Response(
            answer,
            status_code=status,
            headers={
                name.decode("latin-1"): value.decode("latin-1") for name, value in answer_headers
            },
        )

    def check_health(self) -> None:
        if not self.server.ready():
            raise RuntimeError("the Oceanus server in this replica is not ready")

    def __del__(self) -> None:
        server = getattr(self, "server", None)
        if server is not None:
            server.stop()


def build(args: dict[str, Any]) -> Application:
    """The application `serve run` / `serve deploy` builds from the config's `args`:
    `model_repository` (a folder every node can read, or s3:// gs:// as://) and
    `server_options` (the command line's flags as keywords, docs/embedded.md)."""
    repository = args.get("model_repository")
    if not repository:
        raise ValueError("args.model_repository is required (a shared folder or s3://...)")
    options = dict(args.get("server_options") or {})
    application: Application = OceanusReplica.bind(repository, options)  # type: ignore[attr-defined]
    return application
