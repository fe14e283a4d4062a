"""The HTTP/REST frontend: Triton's paths, status codes and error texts over the core.

A hand-written router over `protocol.HttpServer`: most answers are immediate; inference (and
repository load/unload) answer through a `Pending` future, so no task is created per request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from oceanus.core.errors import InferenceServerError, internal, invalid_arg, unsupported
from oceanus.core.observability.tracing import Trace, TraceSettingError
from oceanus.core.server import DECOUPLED_UNSUPPORTED, ServerCore
from oceanus.core.types import InferRequest, InferResponse, is_number
from oceanus.frontends.header_forward import HeaderForward
from oceanus.frontends.http import codec, generate, shared_memory
from oceanus.frontends.http.errors import http_status
from oceanus.frontends.http.extensions import decode_files, handle_logging
from oceanus.frontends.http.infer import (
    HTTP_CALLER,
    Finisher,
    decode_infer,
    decode_infer_later,
    decode_on_loop,
    request_body,
)
from oceanus.frontends.http.protocol import (
    HttpRequest,
    HttpResponse,
    Pending,
    Streamed,
)
from oceanus.frontends.http.responses import (
    JSON,
    HttpError,
    error_of,
    json_response,
)
from oceanus.frontends.trace_settings import unknown_model, update_from_json
from oceanus.logs import LogSettings
from oceanus.proto_json import message_to_dict

log = logging.getLogger("oceanus.http")

EVENT_STREAM = b"text/event-stream; charset=utf-8"
DEFAULT_MAX_INPUT_SIZE = 64 * 1024 * 1024
Outcome = HttpResponse | Pending | Streamed


_OPENAI_HEADS = frozenset({"v1", "health", "version", "tokenize", "detokenize", "score", "rerank"})


class HttpFrontend:
    """`handle(request)` answers one HTTP request (the protocol's handler)."""

    def __init__(
        self,
        core: ServerCore,
        max_input_size: int = DEFAULT_MAX_INPUT_SIZE,
        log_settings: LogSettings | None = None,
        restrictions: dict[str, tuple[str, str]] | None = None,
        header_forward: str = "",
        openai: Callable[[HttpRequest], Outcome] | None = None,
    ) -> None:
        self.core = core
        # The OpenAI-compatible routes (`/v1/...`, frontends/openai), when served on this port.
        self.openai = openai
        self.max_input_size = max_input_size
        # --http-header-forward-pattern
        self.header_forward = HeaderForward(header_forward)
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
            return error_of(exc)

    def _dispatch(self, request: HttpRequest) -> Outcome:
        method = request.method
        # Routing is strict, as in Triton: no trailing slashes, versions are digits.
        parts = request.path.split("/")[1:]
        # /v1/..., and vLLM's /health, /version, /tokenize and /detokenize beside them
        if self.openai is not None and (
            (parts and parts[0] in _OPENAI_HEADS) or request.path == "/v2/rerank"
        ):  # /v2/rerank is vLLM's (Cohere's v2 shape), no KServe route
            return self.openai(request)
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
        if not decode_on_loop(request):
            later = self._infer_later(request, name, version)
            return Pending(asyncio.ensure_future(later), _task_result)
        try:
            infer_request, finisher = decode_infer(
                request, name, version, self.core.shared_memory, self.max_input_size
            )
        except (InferenceServerError, HttpError):
            self._check_model(name, version)
            raise
        return self._submit(request, infer_request, finisher)

    def _check_model(self, name: str, version: str) -> None:
        """Triton looks the model up before it reads the body: a request with a bad body for an
        unknown (or decoupled) model hears about the model. Called only when decoding failed,
        so a good request looks its model up once."""
        if self.core.is_decoupled(name, version):
            raise unsupported(DECOUPLED_UNSUPPORTED.format(caller=HTTP_CALLER))

    def _submit(
        self, request: HttpRequest, infer_request: InferRequest, finisher: Finisher
    ) -> Pending:
        if self.header_forward:
            self.header_forward.apply(request.header_items(), infer_request.parameters)
        if self.core.tracer.active:
            trace = self._start_trace(request, infer_request)
            if trace is not None:
                finisher = _traced(finisher, trace)
        future = self.core.infer(infer_request, caller=HTTP_CALLER)
        return Pending(future, finisher)

    async def _infer_later(self, request: HttpRequest, name: str, version: str) -> HttpResponse:
        """A big body, decoded on a thread while the loop serves the other connections."""
        try:
            try:
                infer_request, finisher = await decode_infer_later(
                    request, name, version, self.core.shared_memory, self.max_input_size
                )
            except (InferenceServerError, HttpError):
                self._check_model(name, version)
                raise
            pending = self._submit(request, infer_request, finisher)
        except Exception as exc:
            return error_of(exc)
        try:
            await asyncio.wait((pending.future,))
        except asyncio.CancelledError:
            pending.future.cancel()  # the client left: a queued request leaves its queue
            raise
        return pending.finish(pending.future)

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


async def _only_response(responses: AsyncIterator[InferResponse]) -> InferResponse:
    """/generate: the one response of the request (a decoupled model must send exactly one)."""
    answers = [response async for response in responses]
    if len(answers) != 1:
        raise internal(generate.ONE_RESPONSE_ONLY)
    return answers[0]


def _generated(future: asyncio.Future[Any]) -> HttpResponse:
    exc = future.exception()
    if exc is not None:
        return error_of(exc)
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


def _task_result(future: asyncio.Future[Any]) -> HttpResponse:
    response: HttpResponse = future.result()
    return response


def _empty_or_error(future: asyncio.Future[Any]) -> HttpResponse:
    exc = future.exception()
    return error_of(exc) if exc is not None else HttpResponse(200)


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
