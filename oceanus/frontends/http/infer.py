"""The inference path of the HTTP frontend: body (decompressed, within the size limit) ->
core request, and core response -> HTTP response. The in-process frontend (app.py) and the
frontend worker processes (frontends/workers/handlers.py) both decode and encode here.

Bodies over DECODE_ON_THREAD_BYTES are decoded on a thread (`decode_infer_later`; see
frontends/decoding.py).
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import zlib
from collections.abc import Callable
from typing import Any

from oceanus.core.errors import InferenceServerError, invalid_arg
from oceanus.core.shared_memory import SharedMemoryManager
from oceanus.core.types import InferRequest, is_number
from oceanus.frontends.compression import inflate, inflate_inline
from oceanus.frontends.decoding import DECODE_ON_THREAD_BYTES
from oceanus.frontends.http import codec
from oceanus.frontends.http.protocol import Headers, HttpRequest, HttpResponse
from oceanus.frontends.http.responses import JSON, HttpError, error_of

log = logging.getLogger("oceanus.http")

OCTET = b"application/octet-stream"
# How Triton names this frontend when it refuses a decoupled model.
HTTP_CALLER = "HTTP end point"


def request_body(request: HttpRequest, max_input_size: int) -> bytes:
    """The request body, decompressed, within --http-max-input-size."""
    if request.too_large:
        size = request.headers.get(b"content-length", b"")
        shown = int(size) if size.isdigit() else max_input_size + 1
        raise invalid_arg(_too_large(shown, max_input_size))
    encoding = request.headers.get(b"content-encoding")
    body = request.body
    if encoding:
        encoding = encoding.strip().lower()
        if encoding != b"identity":
            body = _decompress(body, encoding, max_input_size)
    return body


Finisher = Callable[[asyncio.Future[Any]], HttpResponse]


def decode_on_loop(request: HttpRequest) -> bool:
    """Whether an infer body may be decoded on the event loop: not over DECODE_ON_THREAD_BYTES,
    and not compressed past INFLATE_INLINE_BYTES (the in-process frontend and the frontend
    workers decide alike)."""
    size = len(request.body)
    encoding = request.headers.get(b"content-encoding")
    return size <= DECODE_ON_THREAD_BYTES and inflate_inline(size, encoding)


def decode_infer(
    request: HttpRequest,
    name: str,
    version: str,
    shm: SharedMemoryManager,
    max_input_size: int,
) -> tuple[InferRequest, Finisher]:
    """An infer request's body as a core request, and what turns its outcome into the HTTP
    response (the frontend worker processes call this too)."""
    body = request_body(request, max_input_size)
    headers = request.headers
    header_length = headers.get(b"inference-header-content-length")
    infer_request = codec.decode_infer_request(
        body,
        header_length.decode("latin-1") if header_length is not None else None,
        name,
        version,
        shm,
    )
    parameters = infer_request.parameters
    binary_default = bool(parameters.get("binary_data_output", False)) if parameters else False
    accept = headers.get(b"accept-encoding", b"")
    if log.isEnabledFor(logging.DEBUG):  # --log-verbose 1: each request's path
        log.debug("HTTP infer request '%s' for '%s' received", infer_request.id, name)
    return infer_request, infer_finisher(binary_default, accept)


def infer_route(request: HttpRequest) -> tuple[str, str] | None:
    """(model, version) when the request is `POST /v2/models/<m>[/versions/<v>]/infer`."""
    if request.method != "POST":
        return None
    parts = request.path.split("/")
    if len(parts) == 5 and parts[4] == "infer":
        name, version = parts[3], ""
    elif len(parts) == 7 and parts[6] == "infer" and parts[4] == "versions":
        name, version = parts[3], parts[5]
        if not is_number(version):
            return None
    else:
        return None
    if parts[:3] != ["", "v2", "models"] or not name:
        return None
    return name, version


async def decode_infer_later(
    request: HttpRequest,
    name: str,
    version: str,
    shm: SharedMemoryManager,
    max_input_size: int,
) -> tuple[InferRequest, Finisher]:
    """decode_infer on a thread: for bodies over DECODE_ON_THREAD_BYTES."""
    return await asyncio.to_thread(decode_infer, request, name, version, shm, max_input_size)


def infer_finisher(binary_default: bool, accept: bytes) -> Finisher:
    def finish(future: asyncio.Future[Any]) -> HttpResponse:
        exc = future.exception()
        if log.isEnabledFor(logging.DEBUG):
            log.debug("HTTP infer responded%s", f" with error: {exc}" if exc else "")
        if exc is not None:
            return error_of(exc)
        payload: bytes | memoryview
        try:
            payload, json_size = codec.encode_infer_response(future.result(), binary_default)
        except InferenceServerError as error:
            return error_of(error)
        if json_size is None:
            headers: Headers = [(b"content-type", JSON)]
        else:
            headers = [
                (b"content-type", OCTET),
                (b"inference-header-content-length", str(json_size).encode()),
            ]
        if accept:
            payload, encoding = _compress(payload, accept)
            if encoding:
                headers.append((b"content-encoding", encoding))
        return HttpResponse(200, payload, headers)

    return finish


def _too_large(size: int, limit: int) -> str:
    return (
        f"Request JSON size of {size} bytes exceeds the maximum allowed value of {limit} bytes. "
        "Use --http-max-input-size to increase the limit."
    )


def _decompress(body: bytes, encoding: bytes, limit: int) -> bytes:
    try:
        data = inflate(body, encoding, limit)
    except zlib.error as exc:
        raise invalid_arg(f"failed to decompress the request body: {exc}") from None
    if data is None:
        raise HttpError(
            501, "Unsupported compression type", [(b"accept-encoding", b"gzip, deflate")]
        )
    if len(data) > limit:
        raise invalid_arg(_too_large(len(data), limit))
    return data


def _compress(payload: bytes | memoryview, accept: bytes) -> tuple[bytes | memoryview, bytes]:
    encodings = [e.split(b";")[0].strip() for e in accept.lower().split(b",")]
    if b"gzip" in encodings:
        return gzip.compress(payload, compresslevel=6), b"gzip"
    if b"deflate" in encodings:
        return zlib.compress(payload), b"deflate"
    return payload, b""
