"""A ModelInfer message parsed and decoded to the core's request, on the loop only when that
is cheap: the in-process gRPC frontend and the frontend workers (workers/handlers.py) decode
with the same bounds (issue 42)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TypeAlias

from tritonclient.grpc import service_pb2 as pb

from oceanus.core.errors import InferenceServerError
from oceanus.core.shared_memory import SharedMemoryManager
from oceanus.core.types import InferRequest
from oceanus.frontends.decoding import DECODE_ON_THREAD_BYTES
from oceanus.frontends.grpc import codec

# A message naming more tensors and parameters than this is decoded on a thread (each is a
# Python step: 60,000 empty inputs in 1 MiB held the loop for 0.4 s). Each takes at least 2
# bytes, so a message under FEW_BYTES names fewer and is decoded at once.
_MANY = 256
FEW_BYTES = 2 * _MANY

# A request message parsed, with its core request or the error decoding it raised (the caller
# checks the model first, in Triton's order). A message that does not parse raises.
Prepared: TypeAlias = "tuple[pb.ModelInferRequest, InferRequest | InferenceServerError]"


def prepare_now(data: bytes, shm: SharedMemoryManager) -> Prepared:
    """On the calling thread: for messages under FEW_BYTES, or on a thread already."""
    message, raw = codec.parse_infer_request(data)
    return message, decode_parsed(message, raw, shm)


async def prepare(data: bytes, shm: SharedMemoryManager) -> Prepared:
    """Parsed and decoded off the loop when that is heavy: a large message, or a small one
    naming many tensors or parameters."""
    if len(data) > DECODE_ON_THREAD_BYTES:
        return await asyncio.to_thread(prepare_now, data, shm)
    message, raw = codec.parse_infer_request(data)
    if len(data) >= FEW_BYTES and (
        len(message.inputs) + len(message.outputs) + len(message.parameters) > _MANY
    ):
        return message, await asyncio.to_thread(decode_parsed, message, raw, shm)
    return message, decode_parsed(message, raw, shm)


def decode_parsed(
    message: pb.ModelInferRequest,
    raw: Sequence[bytes] | Sequence[memoryview],
    shm: SharedMemoryManager,
) -> InferRequest | InferenceServerError:
    try:
        return codec.decode_infer_request(message, raw, shm)
    except InferenceServerError as exc:
        return exc
