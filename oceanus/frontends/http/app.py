"""The HTTP/REST frontend: a plain ASGI application with Triton's paths, served by uvicorn.

A hand-written router instead of a web framework: the infer path is the hot path, and a framework's
request objects, middleware and dependency resolution cost more per request than the whole of
this file does (see bench/README.md).
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from oceanus.core.errors import InferenceServerError, invalid_arg
from oceanus.core.model_manager import decode_files
from oceanus.core.proto_json import message_to_dict
from oceanus.core.server import ServerCore
from oceanus.frontends.http import codec
from oceanus.frontends.http.errors import http_status

log = logging.getLogger("oceanus.http")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

JSON = b"application/json"
OCTET = b"application/octet-stream"
DEFAULT_MAX_INPUT_SIZE = 64 * 1024 * 1024


class HttpError(Exception):
    """An HTTP-only failure (routing, method, encoding) with its status."""

    def __init__(
        self, status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or []


class HttpFrontend:
    def __init__(self, core: ServerCore, max_input_size: int = DEFAULT_MAX_INPUT_SIZE) -> None:
        self.core = core
        self.max_input_size = max_input_size

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        try:
            await self._dispatch(scope, receive, send)
        except HttpError as exc:
            await _send_error(send, exc.status, exc.message, exc.headers)
        except InferenceServerError as exc:
            await _send_error(send, http_status(exc.code), exc.message)
        except Exception as exc:  # a bug must cost one request, never the server
            log.exception("unexpected error serving %s %s", scope["method"], scope["path"])
            await _send_error(send, 500, f"internal error: {type(exc).__name__}: {exc}")

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        method: str = scope["method"]
        # Routing is strict, as in Triton: no trailing slashes, versions are digits.
        parts = scope["path"].split("/")[1:]
        if not parts or parts[0] != "v2":
            raise HttpError(404, "Not Found")
        parts = parts[1:]
        if not parts:
            _require(method, "GET")
            return await _send_json(send, self.core.metadata())
        head = parts[0]
        if head == "models":
            return await self._models(method, parts[1:], scope, receive, send)
        if head == "health" and len(parts) == 2 and parts[1] in ("live", "ready"):
            _require(method, "GET")
            healthy = self.core.live if parts[1] == "live" else self.core.ready()
            return await _send_empty(send, 200 if healthy else 400)
        if head == "repository":
            return await self._repository(method, parts[1:], scope, receive, send)
        raise HttpError(404, "Not Found")

    async def _repository(
        self, method: str, parts: list[str], scope: Scope, receive: Receive, send: Send
    ) -> None:
        if parts == ["index"]:
            _require(method, "POST")
            body = await self._read_body(scope, receive)
            options = codec.parse_json(body) if body.strip() else {}
            ready_only = bool(options.get("ready")) if isinstance(options, dict) else False
            return await _send_json(send, self.core.repository_index(ready_only))
        if len(parts) == 3 and parts[0] == "models" and parts[2] in ("load", "unload") and parts[1]:
            _require(method, "POST")
            body = await self._read_body(scope, receive)
            document = codec.parse_json(body) if body.strip() else {}
            parameters = document.get("parameters") if isinstance(document, dict) else None
            parameters = parameters if isinstance(parameters, dict) else {}
            name = parts[1]
            if parts[2] == "load":
                config = parameters.get("config")
                if config is not None and not isinstance(config, str):
                    raise invalid_arg("the 'config' parameter must be a string holding JSON")
                files = decode_files(name, parameters)
                await self.core.load_model(name, config, files or None)
            else:
                await self.core.unload_model(name)
            return await _send_empty(send, 200)
        raise HttpError(404, "Not Found")

    async def _models(
        self, method: str, parts: list[str], scope: Scope, receive: Receive, send: Send
    ) -> None:
        if parts == ["stats"]:
            _require(method, "GET")
            return await _send_json(send, {"model_stats": self.core.statistics()})
        if not parts or not parts[0]:
            raise HttpError(404, "Not Found")
        name, rest, version = parts[0], parts[1:], ""
        if rest and rest[0] == "versions":
            if len(rest) < 2 or not rest[1].isdigit():
                raise HttpError(404, "Not Found")
            version, rest = rest[1], rest[2:]
        if len(rest) > 1 or rest == [""]:
            raise HttpError(404, "Not Found")
        action = rest[0] if rest else ""
        if action == "infer":
            _require(method, "POST")
            return await self._infer(name, version, scope, receive, send)
        if action not in ("", "ready", "config", "stats"):
            raise HttpError(404, "Not Found")
        _require(method, "GET")
        if action == "":
            return await _send_json(send, self.core.model_metadata(name, version))
        if action == "ready":
            if self.core.model_ready(name, version):
                return await _send_empty(send, 200)
            raise HttpError(400, "Model version not ready")
        if action == "config":
            return await _send_json(send, message_to_dict(self.core.model_config(name, version)))
        return await _send_json(send, {"model_stats": self.core.statistics(name, version)})

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        encoding = b""
        for key, value in scope["headers"]:
            if key == b"content-length" and int(value or 0) > self.max_input_size:
                raise invalid_arg(_too_large(int(value), self.max_input_size))
            if key == b"content-encoding":
                encoding = value.strip().lower()
        message = await receive()
        body: bytes = message.get("body", b"")
        if message.get("more_body"):
            chunks = [body]
            size = len(body)
            while message.get("more_body"):
                message = await receive()
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.max_input_size:
                    raise invalid_arg(_too_large(size, self.max_input_size))
                chunks.append(chunk)
            body = b"".join(chunks)
        if encoding and encoding != b"identity":
            body = _decompress(body, encoding, self.max_input_size)
        return body

    async def _infer(
        self, name: str, version: str, scope: Scope, receive: Receive, send: Send
    ) -> None:
        body = await self._read_body(scope, receive)
        header_length: str | None = None
        accept = b""
        for key, value in scope["headers"]:
            if key == b"inference-header-content-length":
                header_length = value.decode("latin-1")
            elif key == b"accept-encoding":
                accept = value
        request = codec.decode_infer_request(body, header_length, name, version)
        parameters = request.parameters
        binary_default = bool(parameters.get("binary_data_output", False)) if parameters else False
        future = self.core.infer(request)
        try:
            response = await _until_disconnect(future, receive)
        except asyncio.CancelledError:
            if future.cancelled():  # the client left; there is no one to answer
                return
            raise
        payload, json_size = codec.encode_infer_response(response, binary_default)
        headers = [(b"content-type", OCTET if json_size is not None else JSON)]
        if json_size is not None:
            headers.append((b"inference-header-content-length", str(json_size).encode()))
        if accept:
            payload, encoding = _compress(payload, accept)
            if encoding:
                headers.append((b"content-encoding", encoding))
        headers.append((b"content-length", str(len(payload)).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


async def _until_disconnect(future: asyncio.Future[Any], receive: Receive) -> Any:
    """Await the core's future; if the client disconnects first, cancel it (dropping it from the
    queue) and stop."""
    if future.done():
        return future.result()
    watcher = asyncio.ensure_future(receive())

    def on_message(task: asyncio.Future[Any]) -> None:
        if not task.cancelled() and task.result().get("type") == "http.disconnect":
            future.cancel()

    watcher.add_done_callback(on_message)
    try:
        return await future
    finally:
        watcher.cancel()


def _require(method: str, allowed: str) -> None:
    if method != allowed:
        raise HttpError(405, "Method Not Allowed")


def _too_large(size: int, limit: int) -> str:
    return (
        f"Request JSON size of {size} bytes exceeds the maximum allowed value of {limit} bytes. "
        "Use --http-max-input-size to increase the limit."
    )


def _decompress(body: bytes, encoding: bytes, limit: int) -> bytes:
    if encoding in (b"gzip", b"x-gzip"):
        decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
    elif encoding == b"deflate":
        decoder = zlib.decompressobj()
    else:
        raise HttpError(
            501, "Unsupported compression type", [(b"accept-encoding", b"gzip, deflate")]
        )
    try:
        data = decoder.decompress(body, limit + 1)
    except zlib.error as exc:
        raise invalid_arg(f"failed to decompress the request body: {exc}") from None
    if len(data) > limit:
        raise invalid_arg(_too_large(len(data), limit))
    return data


def _compress(payload: bytes, accept: bytes) -> tuple[bytes, bytes]:
    encodings = [e.split(b";")[0].strip() for e in accept.lower().split(b",")]
    if b"gzip" in encodings:
        return gzip.compress(payload, compresslevel=6), b"gzip"
    if b"deflate" in encodings:
        return zlib.compress(payload), b"deflate"
    return payload, b""


async def _send_json(
    send: Send, document: Any, status: int = 200, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = orjson.dumps(document)
    headers = [(b"content-type", JSON), (b"content-length", str(len(body)).encode())]
    await send(
        {"type": "http.response.start", "status": status, "headers": headers + (extra or [])}
    )
    await send({"type": "http.response.body", "body": body})


async def _send_empty(send: Send, status: int) -> None:
    await send(
        {"type": "http.response.start", "status": status, "headers": [(b"content-length", b"0")]}
    )
    await send({"type": "http.response.body", "body": b""})


async def _send_error(
    send: Send, status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    await _send_json(send, {"error": message}, status, headers)
