"""The HTTP/REST frontend: Triton's paths, status codes and error texts over the core.

A hand-written router over `protocol.HttpServer`: most answers are immediate; inference (and
repository load/unload) answer through a `Pending` future, so no task is created per request.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson

from oceanus.core.errors import InferenceServerError, internal, invalid_arg
from oceanus.core.proto_json import message_to_dict
from oceanus.core.repository import is_number
from oceanus.core.server import ServerCore
from oceanus.core.shared_memory import SharedMemoryManager
from oceanus.core.tracing import Trace, TraceSettingError
from oceanus.core.types import InferRequest, InferResponse
from oceanus.frontends.http import codec, generate, shared_memory
from oceanus.frontends.http.errors import http_status
from oceanus.frontends.http.extensions import decode_files, handle_logging
from oceanus.frontends.http.protocol import (
    Headers,
    HttpRequest,
    HttpResponse,
    Pending,
    Streamed,
)
from oceanus.frontends.trace_settings import unknown_model, update_from_json
from oceanus.logs import LogSettings

log = logging.getLogger("oceanus.http")

JSON = b"application/json"
OCTET = b"application/octet-stream"
EVENT_STREAM = b"text/event-stream; charset=utf-8"
DEFAULT_MAX_INPUT_SIZE = 64 * 1024 * 1024
# How Triton names this frontend when it refuses a decoupled model.
HTTP_CALLER = "HTTP end point"
Outcome = HttpResponse | Pending | Streamed


class HttpError(Exception):
    """An HTTP-only failure (routing, method, encoding) with its status."""

    def __init__(self, status: int, message: str, headers: Headers | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or []


def json_response(document: Any, status: int = 200, headers: Headers | None = None) -> HttpResponse:
    return HttpResponse(status, orjson.dumps(document), [(b"content-type", JSON), *(headers or [])])


def error_response(status: int, message: str, headers: Headers | None = None) -> HttpResponse:
    return json_response({"error": message}, status, headers)


def _error_of(exc: BaseException) -> HttpResponse:
    if isinstance(exc, HttpError):
        return error_response(exc.status, exc.message, exc.headers)
    if isinstance(exc, InferenceServerError):
        return error_response(http_status(exc.code), exc.message)
    log.error("unexpected error: %s", exc, exc_info=exc)
    return error_response(500, f"internal error: {type(exc).__name__}: {exc}")


class HttpFrontend:
    """`handle(request)` answers one HTTP request (the protocol's handler)."""

    def __init__(
        self,
        core: ServerCore,
        max_input_size: int = DEFAULT_MAX_INPUT_SIZE,
        log_settings: LogSettings | None = None,
        restrictions: dict[str, tuple[str, str]] | None = None,
    ) -> None:
        self.core = core
        self.max_input_size = max_input_size
        self.log_settings = log_settings
        # --http-restricted-api: category -> (header, value)
        self.restrictions = {
            category: (header.encode("latin-1"), value.encode("latin-1"))
            for category, (header, value) in (restrictions or {}).items()
        }

    def handle(self, request: HttpRequest) -> Outcome:
        try:
            return self._dispatch(request)
        except Exception as exc:  # every failure answers in the protocol's own form
            return _error_of(exc)

    def _dispatch(self, request: HttpRequest) -> Outcome:
        method = request.method
        # Routing is strict, as in Triton: no trailing slashes, versions are digits.
        parts = request.path.split("/")[1:]
        if not parts or parts[0] != "v2":
            raise HttpError(404, "Not Found")
        parts = parts[1:]
        if self.restrictions:
            self._check_restriction(request, parts)
        if not parts:
            _require(method, "GET")
            return json_response(self.core.metadata())
        head = parts[0]
        if head == "models":
            return self._models(request, parts[1:])
        if head == "health" and len(parts) == 2 and parts[1] in ("live", "ready"):
            _require(method, "GET")
            healthy = self.core.live if parts[1] == "live" else self.core.ready()
            return HttpResponse(200 if healthy else 400)
        if head == "repository":
            return self._repository(request, parts[1:])
        if head in shared_memory.KINDS:
            return self._shared_memory(request, parts)
        if parts == ["trace", "setting"]:
            return self._trace_setting(request, "")
        if head == "logging" and len(parts) == 1 and self.log_settings is not None:
            body = self._body(request) if request.method == "POST" else b""
            status, document = handle_logging(self.log_settings, request.method, body)
            return json_response(document, status)
        raise HttpError(404, "Not Found")

    def _shared_memory(self, request: HttpRequest, parts: list[str]) -> HttpResponse:
        """The system (and CUDA) shared memory extensions: see shared_memory.py."""
        found = shared_memory.route(parts)
        if found is None:
            raise HttpError(404, "Not Found")
        name, action = found
        _require(request.method, shared_memory.allowed_method(action))
        body = None
        if action == "register":
            body = codec.parse_json(self._body(request))
        document = shared_memory.handle(self.core.shared_memory, parts[0], name, action, body)
        if document is None:
            return HttpResponse(200, b"", [(b"content-type", JSON)])
        return json_response(document)

    def _check_restriction(self, request: HttpRequest, parts: list[str]) -> None:
        check_restriction(self.restrictions, request, parts)

    def _repository(self, request: HttpRequest, parts: list[str]) -> Outcome:
        if parts == ["index"]:
            _require(request.method, "POST")
            body = self._body(request)
            options = codec.parse_json(body) if body.strip() else {}
            ready_only = bool(options.get("ready")) if isinstance(options, dict) else False
            return json_response(self.core.repository_index(ready_only))
        if len(parts) == 3 and parts[0] == "models" and parts[2] in ("load", "unload") and parts[1]:
            _require(request.method, "POST")
            body = self._body(request)
            document = codec.parse_json(body) if body.strip() else {}
            parameters = document.get("parameters") if isinstance(document, dict) else None
            parameters = parameters if isinstance(parameters, dict) else {}
            name = parts[1]
            action: Awaitable[None]
            if parts[2] == "load":
                config = parameters.get("config")
                if config is not None and not isinstance(config, str):
                    raise invalid_arg("the 'config' parameter must be a string holding JSON")
                files = decode_files(name, parameters)
                action = self.core.load_model(name, config, files or None)
            else:
                action = self.core.unload_model(name)
            return Pending(asyncio.ensure_future(action), _empty_or_error)
        raise HttpError(404, "Not Found")

    def _models(self, request: HttpRequest, parts: list[str]) -> Outcome:
        method = request.method
        if parts == ["stats"]:
            _require(method, "GET")
            return json_response({"model_stats": self.core.statistics()})
        if not parts or not parts[0]:
            raise HttpError(404, "Not Found")
        name, rest, version = parts[0], parts[1:], ""
        if rest and rest[0] == "versions":
            if len(rest) < 2 or not is_number(rest[1]):
                raise HttpError(404, "Not Found")
            version, rest = rest[1], rest[2:]
        if rest == ["trace", "setting"] and not version:  # no versions here, as in Triton
            return self._trace_setting(request, name)
        if len(rest) > 1 or rest == [""]:
            raise HttpError(404, "Not Found")
        action = rest[0] if rest else ""
        if action == "infer":
            _require(method, "POST")
            return self._infer(request, name, version)
        if action in ("generate", "generate_stream"):
            _require(method, "POST")
            return self._generate(request, name, version, action == "generate_stream")
        if action not in ("", "ready", "config", "stats"):
            raise HttpError(404, "Not Found")
        _require(method, "GET")
        if action == "":
            return json_response(self.core.model_metadata(name, version))
        if action == "ready":
            if self.core.model_ready(name, version):
                return HttpResponse(200)
            raise HttpError(400, "Model version not ready")
        if action == "config":
            return json_response(message_to_dict(self.core.model_config(name, version)))
        return json_response({"model_stats": self.core.statistics(name, version)})

    def _body(self, request: HttpRequest) -> bytes:
        return request_body(request, self.max_input_size)

    def _infer(self, request: HttpRequest, name: str, version: str) -> Outcome:
        infer_request, finisher = decode_infer(
            request, name, version, self.core.shared_memory, self.max_input_size
        )
        if self.core.tracer.active:
            trace = self._start_trace(request, infer_request)
            if trace is not None:
                finisher = _traced(finisher, trace)
        future = self.core.infer(infer_request, caller=HTTP_CALLER)
        return Pending(future, finisher)

    def _generate(self, request: HttpRequest, name: str, version: str, streaming: bool) -> Outcome:
        """The generate extension (generate.py): one JSON object, or server-sent events."""
        encoding = request.headers.get(b"content-encoding", b"identity").strip().lower()
        if encoding != b"identity":
            raise invalid_arg("Unsupported content-encoding, only 'identity' is supported.")
        inputs = self.core.model_metadata(name, version)["inputs"]
        body = self._body(request)
        infer_request = generate.decode_generate_request(body, name, version, inputs)
        responses = self.core.infer_stream(infer_request)
        if streaming:
            return Streamed(_events(responses))
        return Pending(asyncio.ensure_future(_only_response(responses)), _generated)

    def _start_trace(self, request: HttpRequest, infer_request: InferRequest) -> Trace | None:
        tracer = self.core.tracer
        traceparent = None
        if tracer.propagates_context:
            header = request.headers.get(b"traceparent")
            traceparent = header.decode("latin-1") if header is not None else None
        trace = tracer.sample(infer_request.model_name, traceparent)
        if trace is not None:
            trace.capture("HTTP_RECV_START", request.begin_ns)
            trace.capture("HTTP_RECV_END", request.end_ns)
            infer_request.trace = trace
        return trace

    def _trace_setting(self, request: HttpRequest, model_name: str) -> HttpResponse:
        """`GET/POST /v2[/models/<m>]/trace/setting`: Triton's trace extension."""
        if request.method not in ("GET", "POST"):
            raise HttpError(405, "Method Not Allowed")
        if model_name and not self.core.model_ready(model_name):
            raise HttpError(400, unknown_model(model_name).message)
        tracer = self.core.tracer
        if request.method == "POST":
            document = codec.parse_json(self._body(request))
            if not isinstance(document, dict):
                raise invalid_arg("trace setting request must be a JSON object")
            try:
                tracer.update(model_name, update_from_json(document))
            except TraceSettingError as exc:
                raise HttpError(501 if exc.code == "UNSUPPORTED" else 400, exc.message) from None
        return json_response(tracer.document(model_name))


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
    return infer_request, _infer_finisher(binary_default, accept)


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


def check_restriction(
    restrictions: dict[str, tuple[bytes, bytes]], request: HttpRequest, parts: list[str]
) -> None:
    """403 unless the request carries the header its API group needs (Triton checks this
    before anything else, the method included)."""
    rule = restrictions.get(_category(parts))
    if rule is not None:
        header, value = rule
        if request.headers.get(header) != value:
            raise HttpError(
                403, f"This API is restricted, expecting header '{header.decode('latin-1')}'"
            )


def _infer_finisher(binary_default: bool, accept: bytes) -> Finisher:
    def finish(future: asyncio.Future[Any]) -> HttpResponse:
        exc = future.exception()
        if log.isEnabledFor(logging.DEBUG):
            log.debug("HTTP infer responded%s", f" with error: {exc}" if exc else "")
        if exc is not None:
            return _error_of(exc)
        payload: bytes | memoryview
        try:
            payload, json_size = codec.encode_infer_response(future.result(), binary_default)
        except InferenceServerError as error:
            return _error_of(error)
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


async def _only_response(responses: AsyncIterator[InferResponse]) -> InferResponse:
    """/generate: the one response of the request (a decoupled model must send exactly one)."""
    answers = [response async for response in responses]
    if len(answers) != 1:
        raise internal(generate.ONE_RESPONSE_ONLY)
    return answers[0]


def _generated(future: asyncio.Future[Any]) -> HttpResponse:
    exc = future.exception()
    if exc is not None:
        return _error_of(exc)
    return json_response(generate.generate_document(future.result()))


async def _events(responses: AsyncIterator[InferResponse]) -> AsyncIterator[HttpResponse | bytes]:
    """/generate_stream: each response as a server-sent event. The status is the first
    response's (an error's status if it fails); a later error is sent as an event."""
    head = [(b"content-type", EVENT_STREAM)]
    try:
        first = await anext(responses)
    except StopAsyncIteration:
        yield HttpResponse(200, headers=head)
        return
    except InferenceServerError as exc:
        yield HttpResponse(http_status(exc.code), headers=head)
        yield generate.server_sent_event({"error": exc.message})
        return
    yield HttpResponse(200, headers=head)
    yield generate.server_sent_event(generate.generate_document(first))
    try:
        async for response in responses:
            yield generate.server_sent_event(generate.generate_document(response))
    except InferenceServerError as exc:
        yield generate.server_sent_event({"error": exc.message})


def _traced(
    finish: Callable[[asyncio.Future[Any]], HttpResponse], trace: Trace
) -> Callable[[asyncio.Future[Any]], HttpResponse]:
    """The finisher of a traced request: its response notes the send times, then ends it."""

    def sent(started: int, ended: int) -> None:
        trace.capture("HTTP_SEND_START", started)
        trace.capture("HTTP_SEND_END", ended)
        trace.finish()

    def traced_finish(future: asyncio.Future[Any]) -> HttpResponse:
        response = finish(future)
        response.on_sent = sent
        return response

    return traced_finish


def _empty_or_error(future: asyncio.Future[Any]) -> HttpResponse:
    exc = future.exception()
    return _error_of(exc) if exc is not None else HttpResponse(200)


# The restricted-API group of each path (Triton's RestrictedCategory), by the path's head.
_GROUPS = {
    "health": "health",
    "repository": "model-repository",
    "logging": "logging",
    "trace": "trace",
    "systemsharedmemory": "shared-memory",
    "cudasharedmemory": "shared-memory",
}
# ... and under /v2/models/<m>[/versions/<v>]/, by the last part.
_MODEL_GROUPS = {
    "ready": "health",
    "config": "model-config",
    "stats": "statistics",
    "infer": "inference",
    "generate": "inference",
    "generate_stream": "inference",
    "setting": "trace",
}


def _category(parts: list[str]) -> str:
    """The API group of the path `/v2/<parts>` ("" when the path names none)."""
    if not parts:
        return "metadata"
    if parts[0] != "models":
        return _GROUPS.get(parts[0], "")
    if parts[1:] == ["stats"]:
        return "statistics"
    rest = parts[2:]
    if rest[:1] == ["versions"]:
        rest = rest[2:]
    return _MODEL_GROUPS.get(rest[-1], "") if rest else "metadata"


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


def _compress(payload: bytes | memoryview, accept: bytes) -> tuple[bytes | memoryview, bytes]:
    encodings = [e.split(b";")[0].strip() for e in accept.lower().split(b",")]
    if b"gzip" in encodings:
        return gzip.compress(payload, compresslevel=6), b"gzip"
    if b"deflate" in encodings:
        return zlib.compress(payload), b"deflate"
    return payload, b""
