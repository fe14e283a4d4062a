"""The in-process HTTP client's fixture (oceanus/frontends/http/testclient.py): the real core
and HTTP frontend over the example models, driven through `HttpFrontend.handle`, no socket."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from oceanus.backends import builtin
from oceanus.core.server import CoreOptions, ServerCore
from oceanus.examples import example_repository
from oceanus.frontends.http.app import HttpFrontend
from oceanus.frontends.http.testclient import HttpTestClient

IN_PROCESS_MODELS = ["simple", "identity_fp16", "identity_bytes"]


@pytest.fixture(scope="module")
def http_client() -> Iterator[HttpTestClient]:
    """One core per module, started on a loop of its own that each request runs."""
    repository = example_repository(IN_PROCESS_MODELS)
    loop = asyncio.new_event_loop()

    async def start() -> ServerCore:
        core = ServerCore(CoreOptions([repository], backends=builtin.registry(entry_points=False)))
        await core.start()
        return core

    core = loop.run_until_complete(start())
    try:
        yield HttpTestClient(HttpFrontend(core), loop)
    finally:
        loop.run_until_complete(core.shutdown())
        loop.close()
