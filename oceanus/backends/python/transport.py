"""How the server and a Python stub talk: the messages of messages.py over a socketpair, tensor
bytes through two shared-memory rings, one per direction (the generic pieces are oceanus.ipc:
rings.py says how the rings work, channel.py how messages are framed and read by several
threads). This module binds them to the Python backend's message kinds."""

from __future__ import annotations

import socket

from oceanus.backends.python.messages import KINDS
from oceanus.ipc import channel as _channel
from oceanus.ipc.channel import Mailbox
from oceanus.ipc.rings import (
    DEFAULT_RING_BYTES,
    RING_HEADER,
    Location,
    RingReader,
    RingWriter,
    create_ring_file,
    shm_dir,
)
from oceanus.ipc.tensors import (
    TensorDesc,
    TensorItem,
    numpy_dtype,
    pack,
    unpack,
    unpack_copies,
)

__all__ = [
    "DEFAULT_RING_BYTES",
    "RING_HEADER",
    "Channel",
    "Location",
    "Mailbox",
    "RingReader",
    "RingWriter",
    "TensorDesc",
    "TensorItem",
    "create_ring_file",
    "numpy_dtype",
    "pack",
    "shm_dir",
    "unpack",
    "unpack_copies",
]


class Channel(_channel.Channel):
    """A channel whose messages are the Python backend's (messages.py), typed on arrival."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(sock, KINDS)
