"""gRPC fixtures: clients of the session server that tests/conftest.py starts."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import tritonclient.grpc as grpcclient

# pytest runs with --import-mode=importlib, which leaves sys.path alone: make this folder's
# helper module (grpc_testlib.py) importable by the test modules beside it.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def grpc_client(server: Any) -> Iterator[grpcclient.InferenceServerClient]:
    """A sync tritonclient.grpc client of the session server."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


@pytest.fixture(scope="session")
def grpc_channel(server: Any) -> Iterator[grpc.Channel]:
    """A raw channel, for RPCs tritonclient does not wrap (health) and malformed requests."""
    channel = grpc.insecure_channel(
        server.grpc_url,
        options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)],
    )
    yield channel
    channel.close()
