"""One Python model instance, server side: drives its stub process (stub.py).

`execute_requests` is called on the instance's thread with the batch the scheduler formed; it
writes the inputs to the stub's shared-memory ring, sends one Exec message and waits for the
Result. A reader thread per stub takes every message off the socket: results (copied out of the
ring, then handed to the waiting instance thread), responses of decoupled models (delivered to
each request's stream), log lines, BLS requests and pb_utils calls (server_calls.py) and
cancellation queries.

Health: when the stub dies (crash, os._exit, kill) the watchdog sees it at once, fails the batch
in flight and every open stream with a clear error, marks the instance unhealthy (the model is
then not ready) and starts a new stub; once its `initialize` returns, the instance is healthy
again. Batches that arrive meanwhile wait for the new stub. An `execute` that runs longer than the
model's `execute_timeout_seconds` parameter fails its requests and the stub is killed and
restarted.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import itertools
import json
import logging
import subprocess
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.backends.python import messages as msg
from oceanus.backends.python import transport as tp
from oceanus.backends.python.server_calls import (
    ServerCalls,
    on_metric,
    payload_outputs,
    payload_parameters,
)
from oceanus.backends.python.stub import (
    IS_READY_CACHE_S,
    Stub,
    exit_text,
    spawn,
    unlink,
)
from oceanus.core.backend import (
    LoadContext,
    RequestInstance,
    RequestJob,
    RequestsResult,
    ResponseStream,
)
from oceanus.core.custom_metrics import CustomMetricRegistry
from oceanus.core.errors import InferenceServerError, internal, invalid_arg, unavailable
from oceanus.core.model_config import sequence_control_types
from oceanus.core.proto_json import message_to_dict
from oceanus.core.types import InferRequest

log = logging.getLogger("oceanus.backends.python")
model_log = logging.getLogger("oceanus.backends.python.model")

EXECUTE_TIMEOUT_PARAMETER = "execute_timeout_seconds"
# How long a batch waits for a restarting stub before it fails.
RESTART_WAIT_S = 120.0
FINALIZE_WAIT_S = 30.0
# Nobody waits on a stub's socket between batches: a standby thread reads it (log lines, BLS
# calls from the model's own threads) once it has gone unread this long.
STANDBY_AFTER_S = 0.02
# A model's is_ready(): an endpoint waits this long for a fresh answer (on the event loop) before
# it reports the last one; a check unanswered this long reports not ready (Triton's 5 s timeout).
IS_READY_WAIT_S = 0.2
IS_READY_TIMEOUT_S = 5.0
# Custom metrics of instances loaded without a running server core (unit tests).
_FALLBACK_METRICS = CustomMetricRegistry()
# Request parameters Triton turns into request fields instead of passing them on to the model.
_RESERVED_PARAMETERS = frozenset(
    {
        "sequence_id",
        "sequence_start",
        "sequence_end",
        "priority",
        "timeout",
        "binary_data_output",
    }
)
_MODEL_LOG_LEVELS = {
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "VERBOSE": logging.DEBUG,
}


def _parameter(config: mc.ModelConfig, key: str) -> str | None:
    for name, value in config.parameters.items():
        if name.lower() == key:
            return str(value.string_value)
    return None


class _Batch:
    """A batch sent to the worker; `result` is set (under the mailbox's lock) when it is done:
    (outputs per request, output copy time) or the error of the whole batch."""

    __slots__ = ("done", "jobs", "keys", "result")

    def __init__(self, jobs: Sequence[RequestJob], keys: list[int]) -> None:
        self.jobs = jobs
        self.keys = keys
        self.done = False
        self.result: Any = None


class PythonInstance(RequestInstance):
    """A model instance whose model.py runs in a stub process."""

    def __init__(self, context: LoadContext) -> None:
        config, model_path, spec = context.config, context.files.model_path, context.spec
        # The server BLS requests and pb_utils' model calls go to (None: not in a server).
        self._server = context.server
        self._calls = ServerCalls(context.server, config.name)
        self.name = spec.name
        self.model_name = config.name
        self.decoupled = bool(config.model_transaction_policy.decoupled)
        self._model_path = model_path
        self._input_types = {
            t.name: mc.DataType.Name(t.data_type)[5:].replace("STRING", "BYTES")
            for t in config.input
        }
        # The sequence batcher's control tensors (START, END, READY, CORRID) reach execute too.
        self._input_types.update(sequence_control_types(config))
        self._all_outputs = [t.name for t in config.output]
        # Implicit state outputs always come back: the core carries them to the sequence's next
        # request (Triton 2.51's Python backend drops them; docs/sequence-batching.md).
        self._state_outputs = [s.output_name for s in config.sequence_batching.state]
        version_dir = model_path.parent
        self._args = {
            "model_config": json.dumps(message_to_dict(config)),
            "model_instance_kind": spec.kind,
            "model_instance_name": spec.name,
            "model_instance_device_id": str(spec.device_id),
            "model_repository": str(version_dir.parent),
            "model_version": version_dir.name,
            "model_name": config.name,
        }
        timeout = _parameter(config, EXECUTE_TIMEOUT_PARAMETER)
        try:
            self._execute_timeout = float(timeout) if timeout else 0.0
        except ValueError:
            raise invalid_arg(
                f"model '{config.name}': parameter '{EXECUTE_TIMEOUT_PARAMETER}' must be a "
                f"number of seconds, got '{timeout}'"
            ) from None
        self._capacity = tp.DEFAULT_RING_BYTES
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._closing = False
        self._generation = 0
        self._stub: Stub | None = None
        self._batches: dict[int, _Batch] = {}
        self._jobs: dict[int, RequestJob] = {}  # key -> job, while its batch executes
        self._streams: dict[int, ResponseStream | None] = {}  # key -> its stream (decoupled)
        # key -> (outputs or error, parameters): a non-decoupled model's response sent through
        # its response sender, until the batch's result comes.
        self._stash: dict[
            int, tuple[dict[str, np.ndarray] | InferenceServerError, dict[str, Any] | None]
        ] = {}
        self._keys = itertools.count(1)
        self._batch_ids = itertools.count(1)
        self._start()

    def _metric_registry(self) -> CustomMetricRegistry:
        return self._server.custom_metrics if self._server is not None else _FALLBACK_METRICS

    # ---- the stub's life --------------------------------------------------------------------

    def _start(self) -> None:
        """Start a stub and wait for its initialize(); raises with the model's error."""
        generation = self._generation + 1
        metrics = self._metric_registry().owner()

        def init(s2w: str, w2s: str, capacity: int, spill_prefix: str) -> msg.Init:
            model = str(self._model_path)
            return msg.Init(model, self._args, self.decoupled, s2w, w2s, capacity, spill_prefix)

        def early(channel: tp.Channel, message: msg.Message) -> None:
            """What initialize() sends before it returns: log lines, metrics, model control."""
            if isinstance(message, msg.Log):
                self._on_log(message)
            elif isinstance(message, msg.Call):
                self._calls.on_call(channel, metrics, message)
            elif isinstance(message, msg.MetricUpdate):
                on_metric(metrics, message)

        try:
            stub = spawn(self.name, generation, init, self._capacity, metrics, early)
        except BaseException:
            metrics.close()
            raise
        stub.mailbox = tp.Mailbox(
            stub.channel,
            functools.partial(self._dispatch, stub),
            stub.process.kill,  # end of file: the stub is gone or broken; the watchdog takes over
            # A decoupled model's responses come while nobody waits: read them at once.
            standby_after_s=0.0 if self.decoupled else STANDBY_AFTER_S,
        )
        with self._lock:
            self._generation = generation
            self._stub = stub
        standby = threading.Thread(
            target=stub.mailbox.standby, name=f"{self.name}-reader", daemon=True
        )
        watchdog = threading.Thread(
            target=self._watch, args=(stub,), name=f"{self.name}-watchdog", daemon=True
        )
        stub.threads += [standby, watchdog]
        standby.start()
        watchdog.start()
        self._ready.set()

    def healthy(self) -> bool:
        return self._ready.is_set()

    def ready_check(self) -> bool:
        """Healthy, and the model's is_ready() (when it has one) said True.

        Called on the event loop by the model ready endpoints. An answer younger than
        IS_READY_CACHE_S is reused; otherwise one check is sent to the stub (never two at a
        time) and this waits up to IS_READY_WAIT_S for it, then reports the last answer (the
        late one is kept for the next call). A check unanswered for IS_READY_TIMEOUT_S, an
        exception or a non-bool result report not ready."""
        if not self._ready.is_set():
            return False
        stub = self._stub
        if stub is None or not stub.has_is_ready:
            return True
        send = None
        with self._lock:
            now = time.monotonic()
            if stub.check_id is None and now - stub.checked_at >= IS_READY_CACHE_S:
                send = stub.check_id = next(self._keys)
                stub.check_sent = now
            pending = stub.check_id
        if send is not None:
            try:
                stub.channel.send(msg.IsReady(send))
            except OSError:
                return False
        mailbox = stub.mailbox
        if pending is not None and mailbox is not None:
            mailbox.wait(lambda: stub.check_id != pending or mailbox.closed, IS_READY_WAIT_S)
        with self._lock:
            late = stub.check_id is not None and (
                time.monotonic() - stub.check_sent > IS_READY_TIMEOUT_S
            )
            return stub.user_ready and not late and self._ready.is_set()

    def _watch(self, stub: Stub) -> None:
        """The watchdog: learns at once when the stub process ends, whatever the cause."""
        stub.process.wait()
        try:
            self._stub_gone(stub)
        except Exception:  # must never leave requests hanging silently
            log.exception("model instance '%s': handling the stub process's end failed", self.name)

    def _stub_gone(self, stub: Stub) -> None:
        with self._lock:
            if stub.generation != self._generation:
                return
            self._ready.clear()
            batches, self._batches = self._batches, {}
            streams, self._streams = self._streams, {}
            self._stash.clear()
            closing = self._closing
        returncode = stub.process.returncode
        if closing:
            error = unavailable("model is being unloaded")
        else:
            # Triton 2.51's sentence first, then what happened and what is being done.
            what = exit_text(returncode)
            error = internal(
                f"Stub process '{self.name}' is not healthy. "
                f"{what[0].upper()}{what[1:]}; a new one is being started."
            )
            log.error(
                "the stub process of model instance '%s' is gone (%s); restarting it",
                self.name,
                exit_text(returncode),
            )
        mailbox = stub.mailbox
        assert mailbox is not None
        with mailbox.cond:
            for batch in batches.values():
                batch.result = error
                batch.done = True
            mailbox.cond.notify_all()
        stub.channel.close()  # a thread still reading gets end of file
        mailbox.close()
        stub.metrics.close()
        for path in glob.glob(f"{stub.prefix}-*"):
            unlink(path)
        # Nothing reads this stub's channel any more once its standby reader has seen the close:
        # its rings and wake-up pipe can go (a restarted stub must not leave them open).
        for thread in stub.threads:
            if thread is not threading.current_thread():
                thread.join(timeout=5)
        mailbox.dispose()
        stub.writer.close()
        stub.reader.close()
        for stream in streams.values():
            if stream is not None:
                stream.send(None, error, True)
        if not closing:
            self._restart()

    def _restart(self) -> None:
        delay = 0.2
        while not self._closing:
            try:
                self._start()
            except Exception as exc:
                message = exc.message if isinstance(exc, InferenceServerError) else str(exc)
                log.error(
                    "failed to restart the stub process of model instance '%s': %s",
                    self.name,
                    message,
                )
                time.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            log.info("model instance '%s': stub process restarted", self.name)
            return

    def close(self) -> None:
        with self._lock:
            self._closing = True
            stub = self._stub
        self._ready.set()  # wake batches waiting for a restart; they see _closing
        if stub is None or stub.mailbox is None:
            return
        mailbox = stub.mailbox
        try:
            stub.channel.send(msg.Finalize())
            mailbox.wait(lambda: stub.finalized or mailbox.closed, FINALIZE_WAIT_S)
        except OSError:
            pass
        try:
            stub.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            stub.process.kill()
        for thread in stub.threads:
            if thread is not threading.current_thread():
                thread.join(timeout=10)
        stub.metrics.close()
        stub.writer.close()
        stub.reader.close()

    # ---- execution ----------------------------------------------------------------------------

    def execute_requests(self, jobs: Sequence[RequestJob]) -> RequestsResult:
        started = time.monotonic_ns()
        keys = [next(self._keys) for _ in jobs]
        groups = []
        entries = []
        input_types = self._input_types
        for key, job in zip(keys, jobs, strict=True):
            request: InferRequest = job.request
            groups.append([(name, input_types[name], array) for name, array in job.inputs.items()])
            entries.append((key, request.id, *self._request_fields(request)))
        retried = False
        while True:
            if not self._ready.is_set() and not self._ready.wait(RESTART_WAIT_S):
                raise self._unhealthy()
            batch = _Batch(jobs, keys)
            batch_id = next(self._batch_ids)
            with self._lock:
                stub = self._stub
                if self._closing or stub is None:
                    raise unavailable("model is being unloaded")
                if not self._ready.is_set():
                    continue  # died just now: wait for the new stub
                self._batches[batch_id] = batch
                for key, job in zip(keys, jobs, strict=True):
                    self._jobs[key] = job
                    if self.decoupled:
                        self._streams[key] = job.stream
            try:
                stub.channel.send_tensors(
                    stub.writer,
                    groups,
                    lambda loc, descs, batch_id=batch_id: msg.Exec(  # type: ignore[misc]
                        batch_id, loc, [(*e, d) for e, d in zip(entries, descs, strict=True)]
                    ),
                )
            except OSError:
                # The stub died before it got the batch: run the batch on the next one.
                with self._lock:
                    self._batches.pop(batch_id, None)
                if retried or not self._wait_replaced(stub):
                    raise self._unhealthy() from None
                retried = True
                continue
            break
        try:
            sent = time.monotonic_ns()
            assert stub.mailbox is not None
            if stub.mailbox.wait(lambda: batch.done, self._execute_timeout or None):
                item = batch.result
            else:
                item = self._timed_out(batch_id, stub)
        finally:
            for key in keys:
                self._jobs.pop(key, None)
        if isinstance(item, InferenceServerError):
            if self.decoupled:  # the core ends these streams with the error
                with self._lock:
                    for key in keys:
                        self._streams.pop(key, None)
            raise item
        outputs, parameters, output_ns = item
        done = time.monotonic_ns()
        return RequestsResult(
            outputs,
            input_ns=sent - started,
            infer_ns=done - sent - output_ns,
            output_ns=output_ns,
            parameters=parameters if any(p is not None for p in parameters) else None,
        )

    def _unhealthy(self) -> InferenceServerError:
        return internal(f"Stub process '{self.name}' is not healthy.")

    def _wait_replaced(self, stub: Stub) -> bool:
        """Wait until a new stub replaced `stub` (False: not within RESTART_WAIT_S)."""
        deadline = time.monotonic() + RESTART_WAIT_S
        while time.monotonic() < deadline and not self._closing:
            if self._stub is not stub and self._ready.wait(0.01):
                return True
            time.sleep(0.005)
        return False

    def _request_fields(self, request: InferRequest) -> tuple[Any, ...]:
        """(correlation id, flags, timeout, parameters JSON, requested output names)."""
        names = self._all_outputs if request.outputs is None else [o.name for o in request.outputs]
        if self._state_outputs:
            names = names + self._state_outputs
        parameters = request.parameters
        if not parameters:
            return (0, 0, 0, "{}", names)
        correlation = parameters.get("sequence_id", 0)
        if not isinstance(correlation, (int, str)):
            correlation = 0
        flags = (1 if parameters.get("sequence_start") else 0) | (
            2 if parameters.get("sequence_end") else 0
        )
        timeout = parameters.get("timeout", 0)
        if not isinstance(timeout, int):
            timeout = 0
        custom = {k: v for k, v in parameters.items() if k not in _RESERVED_PARAMETERS}
        # Compact, as Triton's request.parameters() text is.
        return (correlation, flags, timeout, json.dumps(custom, separators=(",", ":")), names)

    def _timed_out(self, batch_id: int, stub: Stub) -> InferenceServerError:
        with self._lock:
            self._batches.pop(batch_id, None)
            if stub.generation == self._generation:
                self._ready.clear()  # not ready from now on, not only once the watchdog sees it
        log.error(
            "model instance '%s': execute() did not return within %s s; killing its stub process",
            self.name,
            self._execute_timeout,
        )
        stub.process.kill()
        return unavailable(
            f"Stub process '{self.name}' did not return from execute() within "
            f"{self._execute_timeout:g} s (model parameter '{EXECUTE_TIMEOUT_PARAMETER}'). It was "
            "killed; a new one is being started."
        )

    # ---- messages from the stub --------------------------------------------------------------

    def _dispatch(self, stub: Stub, message: msg.Message) -> None:
        if isinstance(message, msg.Result):
            self._on_result(stub, message)
        elif isinstance(message, msg.Response):
            self._on_response(message, stub)
        elif isinstance(message, msg.Log):
            self._on_log(message)
        elif isinstance(message, msg.Bls):
            self._calls.on_bls(stub, message)
        elif isinstance(message, msg.Query):
            self._on_query(stub, message)
        elif isinstance(message, msg.MetricUpdate):
            on_metric(stub.metrics, message)
        elif isinstance(message, msg.Call):
            self._calls.on_call(stub.channel, stub.metrics, message)
        elif isinstance(message, msg.IsReadyAnswer):
            self._on_is_ready(stub, message)
        elif isinstance(message, msg.Finalized):
            stub.finalized = True

    def _on_result(self, stub: Stub, message: msg.Result) -> None:
        started = time.monotonic_ns()
        batch_id, loc, payloads = message.batch_id, message.location, message.payloads
        error_text = message.error
        with self._lock:
            batch = self._batches.pop(batch_id, None)
        if error_text is not None:
            log.error("%s", error_text)
            if batch is not None:
                batch.result = internal(error_text)
                batch.done = True
            return
        block, token = stub.reader.open(loc) if loc is not None else (None, None)
        try:
            if batch is None:  # timed out meanwhile
                return
            outputs: list[dict[str, np.ndarray] | InferenceServerError] = []
            parameters: list[dict[str, Any] | None] = []
            assert payloads is not None
            for key, payload in zip(batch.keys, payloads, strict=True):
                if payload is None:
                    if self.decoupled:
                        outputs.append({})
                        parameters.append(None)
                    else:
                        stashed = self._stash.pop(key, None)
                        if stashed is None:
                            stashed = (
                                internal(
                                    f"model instance '{self.name}' sent no response for a request"
                                ),
                                None,
                            )
                        outputs.append(stashed[0])
                        parameters.append(stashed[1])
                else:
                    outputs.append(payload_outputs(block, payload))
                    parameters.append(payload_parameters(payload))
        finally:
            stub.reader.release(token)
        batch.result = (outputs, parameters, time.monotonic_ns() - started)
        batch.done = True

    def _on_response(self, message: msg.Response, stub: Stub) -> None:
        key, loc, payload, final = message.key, message.location, message.payload, message.final
        block, token = stub.reader.open(loc) if loc is not None else (None, None)
        try:
            result = payload_outputs(block, payload) if payload is not None else None
        finally:
            stub.reader.release(token)
        parameters = payload_parameters(payload)
        if not self.decoupled:
            if result is not None:
                self._stash[key] = (result, parameters)
            return
        stream = self._streams.get(key)
        if final:
            self._streams.pop(key, None)
        if stream is None:
            return
        if isinstance(result, InferenceServerError):
            stream.send(None, result, final)
        else:
            stream.send(result, None, final, parameters)

    def _on_log(self, message: msg.Log) -> None:
        model_log.log(_MODEL_LOG_LEVELS.get(message.level, logging.INFO), "%s", message.text)

    def _on_query(self, stub: Stub, message: msg.Query) -> None:
        job = self._jobs.get(message.key)
        cancelled = job is not None and job.cancelled()
        with contextlib.suppress(OSError):
            stub.channel.send(msg.QueryAnswer(message.query_id, cancelled))

    def _on_is_ready(self, stub: Stub, message: msg.IsReadyAnswer) -> None:
        check_id, ready, error = message.check_id, message.ready, message.error
        with self._lock:
            if stub.check_id != check_id:
                return
            stub.check_id = None
            stub.checked_at = time.monotonic()
            stub.user_ready = bool(ready) and error is None
        if error is not None:
            log.error("model instance '%s': is_ready() failed: %s", self.name, error)
