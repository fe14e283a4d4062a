"""The Python backend, server side: one worker process per model instance.

`PythonInstance.execute_requests` is called on the instance's thread with the batch the scheduler
formed; it writes the inputs to the instance's shared-memory ring, sends one EXEC message and waits
for the RESULT. A reader thread per worker takes every message off the socket: results (copied
out of the ring, then handed to the waiting instance thread), responses of decoupled models
(delivered to each request's stream), log lines, BLS requests (run through the server core on its
event loop) and cancellation queries.

Health: when the worker dies (crash, os._exit, kill) the reader sees end of file, fails the
batch in flight and every open stream with a clear error, marks the instance unhealthy (the model
is then not ready) and starts a new worker; once its `initialize` returns, the instance is healthy
again. Batches that arrive meanwhile wait for the new worker. An `execute` that runs longer than the
model's `execute_timeout_seconds` parameter fails its requests and the worker is killed and
restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import glob
import itertools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.backends.python import transport as tp
from oceanus.core.backend import (
    Backend,
    LoadContext,
    RequestInstance,
    RequestJob,
    RequestsResult,
    ResponseStream,
    ServerHandle,
)
from oceanus.core.custom_metrics import CustomMetricRegistry, MetricError, MetricOwner
from oceanus.core.errors import (
    ErrorCode,
    InferenceServerError,
    internal,
    invalid_arg,
    unavailable,
)
from oceanus.core.model_config import sequence_control_types
from oceanus.core.proto_json import message_to_dict
from oceanus.core.types import InferRequest, InferResponse, RequestedOutput, Tensor

log = logging.getLogger("oceanus.backends.python")
model_log = logging.getLogger("oceanus.backends.python.model")

EXECUTE_TIMEOUT_PARAMETER = "execute_timeout_seconds"
# How long a batch waits for a restarting worker before it fails.
RESTART_WAIT_S = 120.0
FINALIZE_WAIT_S = 30.0
# Nobody waits on a worker's socket between batches: a standby thread reads it (log lines, BLS
# calls from the model's own threads) once it has gone unread this long.
STANDBY_AFTER_S = 0.02
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[3])
# A model's is_ready(): an answer younger than this is reused; an endpoint waits this long for a
# fresh answer (on the event loop) before it reports the last one; a check unanswered this long
# reports not ready (Triton's 5 s timeout).
IS_READY_CACHE_S = 0.5
IS_READY_WAIT_S = 0.2
IS_READY_TIMEOUT_S = 5.0
# Custom metrics of instances loaded without a running server core (unit tests).
_FALLBACK_METRICS = CustomMetricRegistry()
# How a BLS request names itself when the server refuses a decoupled model.
BLS_CALLER = "BLS"
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


def _worker_command(fd: int) -> list[str]:
    return [sys.executable, "-m", "oceanus.backends.python.worker", str(fd)]


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    path = env.get("PYTHONPATH", "")
    if _PACKAGE_ROOT not in path.split(os.pathsep):
        env["PYTHONPATH"] = _PACKAGE_ROOT + (os.pathsep + path if path else "")
    return env


def _exit_text(returncode: int | None) -> str:
    if returncode is None:
        return "it stopped answering"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"the process was killed by {name}"
    return f"the process exited with status {returncode}"


class PythonBackend(Backend):
    name = "python"
    default_model_filename = "model.py"

    def complete_config(self, config: mc.ModelConfig, model_path: Path, autocomplete: bool) -> None:
        if not autocomplete:
            return
        try:
            source = model_path.read_text(errors="replace")
        except OSError as exc:
            raise invalid_arg(f"failed to read {model_path}: {exc.strerror}") from None
        if "auto_complete_config" not in source:
            return  # no need to start a process to learn that
        completed = _run_autocomplete(model_path, json.dumps(message_to_dict(config)))
        try:
            parsed = json_format.ParseDict(json.loads(completed), mc.ModelConfig())
        except (json_format.ParseError, ValueError) as exc:
            raise invalid_arg(
                f"auto_complete_config of model '{config.name}' returned an invalid config: {exc}"
            ) from None
        config.CopyFrom(parsed)

    def load(self, context: LoadContext) -> RequestInstance:
        return PythonInstance(context)


def _run_autocomplete(model_path: Path, config_json: str) -> str:
    """Call the model's static auto_complete_config in a short-lived worker."""
    parent, child = socket.socketpair()
    process = subprocess.Popen(
        _worker_command(child.fileno()), pass_fds=(child.fileno(),), env=_worker_env()
    )
    child.close()
    channel = tp.Channel(parent)
    try:
        channel.send((tp.AUTOCOMPLETE, str(model_path), config_json))
        try:
            _, error, completed = channel.recv()
        except EOFError:
            raise internal(
                f"auto_complete_config of '{model_path}' failed: {_exit_text(process.wait())}"
            ) from None
    finally:
        channel.close()
        process.wait()
    if error is not None:
        raise internal(error)
    return str(completed)


class _Batch:
    """A batch sent to the worker; `result` is set (under the mailbox's lock) when it is done:
    (outputs per request, output copy time) or the error of the whole batch."""

    __slots__ = ("done", "jobs", "keys", "result")

    def __init__(self, jobs: Sequence[RequestJob], keys: list[int]) -> None:
        self.jobs = jobs
        self.keys = keys
        self.done = False
        self.result: Any = None


class _Worker:
    """One incarnation of the worker process and what belongs to it."""

    def __init__(
        self,
        generation: int,
        process: subprocess.Popen[bytes],
        channel: tp.Channel,
        writer: tp.RingWriter,
        reader: tp.RingReader,
        prefix: str,
        metrics: MetricOwner,
        has_is_ready: bool,
    ) -> None:
        self.generation = generation
        self.process = process
        self.channel = channel
        self.writer = writer
        self.reader = reader
        self.prefix = prefix
        self.metrics = metrics  # the custom metrics this worker created
        self.finalized = False
        self.mailbox: tp.Mailbox | None = None
        self.threads: list[threading.Thread] = []
        # The model's is_ready(), when it has one: the last answer, when it came, the check
        # in flight (id, sent at).
        self.has_is_ready = has_is_ready
        self.user_ready = True
        self.checked_at = -IS_READY_CACHE_S
        self.check_id: int | None = None
        self.check_sent = 0.0


class PythonInstance(RequestInstance):
    """A model instance whose model.py runs in a worker process."""

    def __init__(self, context: LoadContext) -> None:
        config, model_path, spec = context.config, context.files.model_path, context.spec
        # The server BLS requests and pb_utils' model calls go to (None: not in a server).
        self._server = context.server
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
        self._worker: _Worker | None = None
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
        self._bls_tasks: set[asyncio.Future[None]] = set()
        self._start()

    def _metric_registry(self) -> CustomMetricRegistry:
        return self._server.custom_metrics if self._server is not None else _FALLBACK_METRICS

    # ---- the worker's life --------------------------------------------------------------------

    def _start(self) -> None:
        """Start a worker and wait for its initialize(); raises with the model's error."""
        generation = self._generation + 1
        tag = "".join(c if c.isalnum() or c in "-_" else "_" for c in self.name)
        prefix = (
            f"{tp.shm_dir()}/oceanus-py-{os.getpid()}-{tag}-{generation}-{uuid.uuid4().hex[:8]}"
        )
        s2w, w2s = f"{prefix}-s2w", f"{prefix}-w2s"
        tp.create_ring_file(s2w, self._capacity)
        tp.create_ring_file(w2s, self._capacity)
        parent, child = socket.socketpair()
        process: subprocess.Popen[bytes] | None = None
        channel = tp.Channel(parent)
        metrics = self._metric_registry().owner()
        try:
            process = subprocess.Popen(
                _worker_command(child.fileno()), pass_fds=(child.fileno(),), env=_worker_env()
            )
            child.close()
            writer = tp.RingWriter(s2w, self._capacity, f"{prefix}-s-")
            reader = tp.RingReader(w2s, self._capacity)
            channel.send(
                (
                    tp.INIT,
                    str(self._model_path),
                    self._args,
                    self.decoupled,
                    s2w,
                    w2s,
                    self._capacity,
                    f"{prefix}-w-",
                )
            )
            while True:
                try:
                    message = channel.recv()
                except (EOFError, OSError):
                    raise internal(
                        f"Failed to initialize the stub process of model instance "
                        f"'{self.name}': {_exit_text(process.wait())}"
                    ) from None
                if message[0] == tp.LOG:
                    self._on_log(message)
                elif message[0] == tp.CALL:  # from initialize(): metrics, model loading
                    self._on_call(channel, metrics, message)
                elif message[0] == tp.METRIC:
                    _on_metric(metrics, message)
                elif message[0] == tp.READY:
                    break
            if message[1] is not None:
                raise internal(str(message[1]))
        except BaseException:
            metrics.close()
            channel.close()
            child.close()
            if process is not None:
                process.kill()
                process.wait()
            for path in (s2w, w2s):
                _unlink(path)
            raise
        # Both ends have mapped the rings: the names are no longer needed, and nothing is left
        # behind in /dev/shm whatever happens to either process.
        _unlink(s2w)
        _unlink(w2s)
        has_is_ready = len(message) > 2 and bool(message[2])
        worker = _Worker(
            generation, process, channel, writer, reader, prefix, metrics, has_is_ready
        )
        worker.mailbox = tp.Mailbox(
            channel,
            functools.partial(self._dispatch, worker),
            process.kill,  # end of file: the worker is gone or broken; the watchdog takes over
            # A decoupled model's responses come while nobody waits: read them at once.
            standby_after_s=0.0 if self.decoupled else STANDBY_AFTER_S,
        )
        with self._lock:
            self._generation = generation
            self._worker = worker
        standby = threading.Thread(
            target=worker.mailbox.standby, name=f"{self.name}-reader", daemon=True
        )
        watchdog = threading.Thread(
            target=self._watch, args=(worker,), name=f"{self.name}-watchdog", daemon=True
        )
        worker.threads += [standby, watchdog]
        standby.start()
        watchdog.start()
        self._ready.set()

    def healthy(self) -> bool:
        return self._ready.is_set()

    def ready_check(self) -> bool:
        """Healthy, and the model's is_ready() (when it has one) said True.

        Called on the event loop by the model ready endpoints. An answer younger than
        IS_READY_CACHE_S is reused; otherwise one check is sent to the worker (never two at a
        time) and this waits up to IS_READY_WAIT_S for it, then reports the last answer (the
        late one is kept for the next call). A check unanswered for IS_READY_TIMEOUT_S, an
        exception or a non-bool result report not ready."""
        if not self._ready.is_set():
            return False
        worker = self._worker
        if worker is None or not worker.has_is_ready:
            return True
        send = None
        with self._lock:
            now = time.monotonic()
            if worker.check_id is None and now - worker.checked_at >= IS_READY_CACHE_S:
                send = worker.check_id = next(self._keys)
                worker.check_sent = now
            pending = worker.check_id
        if send is not None:
            try:
                worker.channel.send((tp.IS_READY, send))
            except OSError:
                return False
        mailbox = worker.mailbox
        if pending is not None and mailbox is not None:
            mailbox.wait(lambda: worker.check_id != pending or mailbox.closed, IS_READY_WAIT_S)
        with self._lock:
            late = worker.check_id is not None and (
                time.monotonic() - worker.check_sent > IS_READY_TIMEOUT_S
            )
            return worker.user_ready and not late and self._ready.is_set()

    def _watch(self, worker: _Worker) -> None:
        """The watchdog: learns at once when the worker process ends, whatever the cause."""
        worker.process.wait()
        try:
            self._worker_gone(worker)
        except Exception:  # must never leave requests hanging silently
            log.exception("model instance '%s': handling the stub process's end failed", self.name)

    def _worker_gone(self, worker: _Worker) -> None:
        with self._lock:
            if worker.generation != self._generation:
                return
            self._ready.clear()
            batches, self._batches = self._batches, {}
            streams, self._streams = self._streams, {}
            self._stash.clear()
            closing = self._closing
        returncode = worker.process.returncode
        if closing:
            error = unavailable("model is being unloaded")
        else:
            # Triton 2.51's sentence first, then what happened and what is being done.
            what = _exit_text(returncode)
            error = internal(
                f"Stub process '{self.name}' is not healthy. "
                f"{what[0].upper()}{what[1:]}; a new one is being started."
            )
            log.error(
                "the stub process of model instance '%s' is gone (%s); restarting it",
                self.name,
                _exit_text(returncode),
            )
        mailbox = worker.mailbox
        assert mailbox is not None
        with mailbox.cond:
            for batch in batches.values():
                batch.result = error
                batch.done = True
            mailbox.cond.notify_all()
        worker.channel.close()  # a thread still reading gets end of file
        mailbox.close()
        worker.metrics.close()
        for path in glob.glob(f"{worker.prefix}-*"):
            _unlink(path)
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
            worker = self._worker
        self._ready.set()  # wake batches waiting for a restart; they see _closing
        if worker is None or worker.mailbox is None:
            return
        mailbox = worker.mailbox
        try:
            worker.channel.send((tp.FINALIZE,))
            mailbox.wait(lambda: worker.finalized or mailbox.closed, FINALIZE_WAIT_S)
        except OSError:
            pass
        try:
            worker.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            worker.process.kill()
        for thread in worker.threads:
            if thread is not threading.current_thread():
                thread.join(timeout=10)
        worker.metrics.close()
        worker.writer.close()
        worker.reader.close()

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
                worker = self._worker
                if self._closing or worker is None:
                    raise unavailable("model is being unloaded")
                if not self._ready.is_set():
                    continue  # died just now: wait for the new worker
                self._batches[batch_id] = batch
                for key, job in zip(keys, jobs, strict=True):
                    self._jobs[key] = job
                    if self.decoupled:
                        self._streams[key] = job.stream
            try:
                worker.channel.send_tensors(
                    worker.writer,
                    groups,
                    lambda loc, descs, batch_id=batch_id: (  # type: ignore[misc]
                        tp.EXEC,
                        batch_id,
                        loc,
                        [(*e, d) for e, d in zip(entries, descs, strict=True)],
                    ),
                )
            except OSError:
                # The worker died before it got the batch: run the batch on the next one.
                with self._lock:
                    self._batches.pop(batch_id, None)
                if retried or not self._wait_replaced(worker):
                    raise self._unhealthy() from None
                retried = True
                continue
            break
        try:
            sent = time.monotonic_ns()
            assert worker.mailbox is not None
            if worker.mailbox.wait(lambda: batch.done, self._execute_timeout or None):
                item = batch.result
            else:
                item = self._timed_out(batch_id, worker)
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

    def _wait_replaced(self, worker: _Worker) -> bool:
        """Wait until a new worker replaced `worker` (False: not within RESTART_WAIT_S)."""
        deadline = time.monotonic() + RESTART_WAIT_S
        while time.monotonic() < deadline and not self._closing:
            if self._worker is not worker and self._ready.wait(0.01):
                return True
            time.sleep(0.005)
        return False

    def _request_fields(self, request: InferRequest) -> tuple[Any, ...]:
        """(correlation id, flags, timeout, parameters JSON, requested output names)."""
        names = self._all_outputs if request.outputs is None else [o.name for o in request.outputs]
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
        return (correlation, flags, timeout, json.dumps(custom), names)

    def _timed_out(self, batch_id: int, worker: _Worker) -> InferenceServerError:
        with self._lock:
            self._batches.pop(batch_id, None)
            if worker.generation == self._generation:
                self._ready.clear()  # not ready from now on, not only once the watchdog sees it
        log.error(
            "model instance '%s': execute() did not return within %s s; killing its stub process",
            self.name,
            self._execute_timeout,
        )
        worker.process.kill()
        return unavailable(
            f"Stub process '{self.name}' did not return from execute() within "
            f"{self._execute_timeout:g} s (model parameter '{EXECUTE_TIMEOUT_PARAMETER}'). It was "
            "killed; a new one is being started."
        )

    # ---- messages from the worker --------------------------------------------------------------

    def _dispatch(self, worker: _Worker, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == tp.RESULT:
            self._on_result(worker, message)
        elif kind == tp.RESPONSE:
            self._on_response(worker, message)
        elif kind == tp.LOG:
            self._on_log(message)
        elif kind == tp.BLS:
            self._on_bls(worker, message)
        elif kind == tp.QUERY:
            self._on_query(worker, message)
        elif kind == tp.METRIC:
            _on_metric(worker.metrics, message)
        elif kind == tp.CALL:
            self._on_call(worker.channel, worker.metrics, message)
        elif kind == tp.IS_READY_ANSWER:
            self._on_is_ready(worker, message)
        elif kind == tp.FINALIZED:
            worker.finalized = True

    def _on_result(self, worker: _Worker, message: tuple[Any, ...]) -> None:
        started = time.monotonic_ns()
        _, batch_id, loc, payloads, error_text = message
        with self._lock:
            batch = self._batches.pop(batch_id, None)
        if error_text is not None:
            log.error("%s", error_text)
            if batch is not None:
                batch.result = internal(error_text)
                batch.done = True
            return
        block, token = worker.reader.open(loc) if loc is not None else (None, None)
        try:
            if batch is None:  # timed out meanwhile
                return
            outputs: list[dict[str, np.ndarray] | InferenceServerError] = []
            parameters: list[dict[str, Any] | None] = []
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
                    outputs.append(_payload_outputs(block, payload))
                    parameters.append(_payload_parameters(payload))
        finally:
            worker.reader.release(token)
        batch.result = (outputs, parameters, time.monotonic_ns() - started)
        batch.done = True

    def _on_response(self, worker: _Worker, message: tuple[Any, ...]) -> None:
        _, key, loc, payload, final = message
        block, token = worker.reader.open(loc) if loc is not None else (None, None)
        try:
            result = _payload_outputs(block, payload) if payload is not None else None
        finally:
            worker.reader.release(token)
        parameters = _payload_parameters(payload)
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

    def _on_log(self, message: tuple[Any, ...]) -> None:
        _, level, text = message
        model_log.log(_MODEL_LOG_LEVELS.get(level, logging.INFO), "%s", text)

    def _on_query(self, worker: _Worker, message: tuple[Any, ...]) -> None:
        query_id, key = message[1], message[2]
        job = self._jobs.get(key)
        answer = job is not None and job.cancelled()
        with contextlib.suppress(OSError):
            worker.channel.send((tp.QUERY_ANSWER, query_id, answer))

    def _on_is_ready(self, worker: _Worker, message: tuple[Any, ...]) -> None:
        _, check_id, ready, error = message
        with self._lock:
            if worker.check_id != check_id:
                return
            worker.check_id = None
            worker.checked_at = time.monotonic()
            worker.user_ready = bool(ready) and error is None
        if error is not None:
            log.error("model instance '%s': is_ready() failed: %s", self.name, error)

    # ---- pb_utils calls the server answers ---------------------------------------------------

    def _on_call(self, channel: tp.Channel, metrics: MetricOwner, message: tuple[Any, ...]) -> None:
        _, call_id, operation, args = message
        if operation in _METRIC_CALLS:
            try:
                result = getattr(metrics, _METRIC_CALLS[operation])(*args)
            except MetricError as exc:
                _answer(channel, call_id, str(exc), None)
            else:
                _answer(channel, call_id, None, result)
            return
        server = self._server
        if server is None:
            _answer(channel, call_id, f"pb_utils.{operation} needs a running server", None)
            return
        server.loop.call_soon_threadsafe(
            self._call_on_loop, server, channel, call_id, operation, args
        )

    def _call_on_loop(
        self, server: ServerHandle, channel: tp.Channel, call_id: int, operation: str, args: Any
    ) -> None:
        """On the event loop: readiness, load and unload through the server core."""
        if operation == "model_ready":
            name, version = args
            _answer(channel, call_id, None, bool(server.model_ready(name, version)))
            return
        if operation == "load_model":
            name, config, files = args
            wrong = [key for key in files if not key.startswith("file:")]
            if wrong:
                error = f"Unrecognized load parameter '{wrong[0]}' with type 'BYTES'"
                _answer(channel, call_id, error, None)
                return
            contents = {key[len("file:") :]: value for key, value in files.items()}
            coroutine = server.load_model(name, config or None, contents or None)
        elif operation == "unload_model":
            name = args[0]
            coroutine = server.unload_model(name)
        else:
            _answer(channel, call_id, f"unknown operation '{operation}'", None)
            return
        task = asyncio.ensure_future(coroutine)
        self._bls_tasks.add(task)

        def done(task: asyncio.Future[None]) -> None:
            self._bls_tasks.discard(task)
            if task.cancelled():
                _answer(channel, call_id, "cancelled", None)
                return
            exc = task.exception()
            if exc is None:
                _answer(channel, call_id, None, None)
            else:
                _answer(channel, call_id, _as_server_error(exc).message, None)

        if operation == "unload_model" and name == self.model_name:
            # A model unloading itself from execute(): the unload waits for that very request,
            # so the answer cannot wait for the unload.
            task.add_done_callback(self._bls_tasks.discard)
            _answer(channel, call_id, None, None)
            return
        task.add_done_callback(done)

    # ---- BLS ---------------------------------------------------------------------------------

    def _on_bls(self, worker: _Worker, message: tuple[Any, ...]) -> None:
        (
            _,
            bls_id,
            model_name,
            version,
            request_id,
            correlation_id,
            flags,
            timeout,
            parameters_json,
            names,
            decoupled,
            loc,
            descs,
        ) = message
        block, token = worker.reader.open(loc) if loc is not None else (None, None)
        try:
            arrays = tp.unpack(block, descs, copy=True)
        finally:
            worker.reader.release(token)
        parameters: dict[str, Any] = json.loads(parameters_json) if parameters_json else {}
        if correlation_id:
            parameters["sequence_id"] = correlation_id
        if flags & 1:
            parameters["sequence_start"] = True
        if flags & 2:
            parameters["sequence_end"] = True
        if timeout:
            parameters["timeout"] = timeout
        request = InferRequest(
            model_name=model_name,
            model_version=str(version) if version >= 0 else "",
            id=request_id,
            inputs=[Tensor(n, d, tuple(a.shape), a) for n, d, a in arrays],
            outputs=[RequestedOutput(n) for n in names] if names else None,
            parameters=parameters,
        )
        server = self._server
        if server is None:
            self._bls_reply(worker, bls_id, None, internal("BLS needs a running server"), True)
            return
        server.loop.call_soon_threadsafe(
            self._bls_start, server, worker, bls_id, request, decoupled
        )

    def _bls_start(
        self,
        server: ServerHandle,
        worker: _Worker,
        bls_id: int,
        request: InferRequest,
        decoupled: bool,
    ) -> None:
        """On the event loop: run the request through the core. Errors before the request is
        queued get Triton's BLS wording (request_executor.cc)."""
        name, version = request.model_name, request.model_version
        try:
            if not server.model_serving(name, version):
                raise internal(
                    f"Failed for execute the inference request. Model '{name}' is not ready."
                )
            if decoupled:
                # A decoupled model's final flag sent alone reaches a BLS caller as an empty
                # response, as in Triton.
                stream = server.infer_stream(request, empty_final=True)
                task = asyncio.ensure_future(self._bls_stream(worker, bls_id, stream))
                self._bls_tasks.add(task)
                task.add_done_callback(self._bls_tasks.discard)
                return
            if server.is_decoupled(name, version):
                raise internal(
                    f"Model {name} is using the decoupled. The current BLS request call doesn't "
                    "support models using the decoupled transaction policy. Please use "
                    "'decoupled=True' argument to the 'exec' or 'async_exec' calls for "
                    "decoupled models.'"
                )
            future = server.infer(request, caller=BLS_CALLER)
        except InferenceServerError as exc:
            error = internal(f"Model {name} - Error when running inference: {exc.message}")
            self._bls_reply(worker, bls_id, None, error, True)
            return

        def done(future: asyncio.Future[InferResponse]) -> None:
            if future.cancelled():
                self._bls_reply(worker, bls_id, None, unavailable("request cancelled"), True)
                return
            exc = future.exception()
            if exc is None:
                self._bls_reply(worker, bls_id, future.result(), None, True)
            else:
                self._bls_reply(worker, bls_id, None, _as_server_error(exc), True)

        future.add_done_callback(done)

    async def _bls_stream(
        self, worker: _Worker, bls_id: int, stream: AsyncIterator[InferResponse]
    ) -> None:
        try:
            async for response in stream:
                self._bls_reply(worker, bls_id, response, None, False)
        except Exception as exc:
            self._bls_reply(worker, bls_id, None, _as_server_error(exc), True)
            return
        self._bls_reply(worker, bls_id, None, None, True)

    def _bls_reply(
        self,
        worker: _Worker,
        bls_id: int,
        response: InferResponse | None,
        error: InferenceServerError | None,
        final: bool,
    ) -> None:
        try:
            if error is not None:
                payload = ("err", error.code.name, error.message)
                worker.channel.send((tp.BLS_RESPONSE, bls_id, None, payload, final))
            elif response is None:
                worker.channel.send((tp.BLS_RESPONSE, bls_id, None, None, final))
            else:
                tensors = [(t.name, t.datatype, t.data) for t in response.outputs]
                parameters = json.dumps(
                    {
                        k: v
                        for k, v in response.parameters.items()
                        if isinstance(v, (bool, int, str))
                    }
                )
                worker.channel.send_tensors(
                    worker.writer,
                    [tensors],
                    lambda loc, descs: (
                        tp.BLS_RESPONSE,
                        bls_id,
                        loc,
                        ("ok", descs[0], parameters),
                        final,
                    ),
                )
        except OSError:
            pass  # the worker is gone


_METRIC_CALLS = {
    "family_new": "new_family",
    "metric_new": "new_metric",
    "metric_value": "value",
}
_METRIC_UPDATES = ("increment", "set", "observe")


def _on_metric(metrics: MetricOwner, message: tuple[Any, ...]) -> None:
    """A metric update or deletion (no answer: the worker checked what it could)."""
    _, number, operation, value = message
    if operation in _METRIC_UPDATES:
        metrics.update(number, operation, value)
    elif operation == "delete_metric":
        metrics.delete_metric(number)
    elif operation == "delete_family":
        metrics.delete_family(number)


def _answer(channel: tp.Channel, call_id: int, error: str | None, result: Any) -> None:
    with contextlib.suppress(OSError):  # the worker is gone
        channel.send((tp.CALL_ANSWER, call_id, error, result))


def _payload_outputs(
    block: np.ndarray | None, payload: tuple[Any, ...]
) -> dict[str, np.ndarray] | InferenceServerError:
    if payload[0] == "err":
        _, code, message = payload
        return InferenceServerError(ErrorCode[code], message)
    _, descs, _parameters = payload
    return {name: array for name, _, array in tp.unpack(block, descs, copy=True)}


def _payload_parameters(payload: tuple[Any, ...] | None) -> dict[str, Any] | None:
    """The response parameters a model set (None when it set none)."""
    if payload is None or payload[0] != "ok" or not payload[2] or payload[2] == "{}":
        return None
    parameters = json.loads(payload[2])
    return parameters if isinstance(parameters, dict) and parameters else None


def _as_server_error(exc: BaseException) -> InferenceServerError:
    if isinstance(exc, InferenceServerError):
        return exc
    return internal(f"{type(exc).__name__}: {exc}")


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
