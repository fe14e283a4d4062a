"""One Python model instance, server side: drives its stub process, one at a time.

`execute_requests` is called on the instance's thread with the batch the scheduler formed; it
writes the inputs to the stub's shared-memory ring, sends one Exec message and waits for the
Result, reading the stub's channel itself meanwhile (mailbox). A standby thread reads what comes
while nobody waits: responses of decoupled models, log lines, BLS requests and pb_utils calls
(server_calls.py), cancellation queries; dispatch.py says where each kind goes, batches.py holds
what is in flight.

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
import itertools
import logging
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from oceanus.backends.python import messages as msg
from oceanus.backends.python import transport as tp
from oceanus.backends.python.batches import Batch, InFlight, exec_message, request_head
from oceanus.backends.python.dispatch import Dispatcher
from oceanus.backends.python.exec_env import resolve as resolve_env
from oceanus.backends.python.loop_batches import LoopBatches, small_tensors
from oceanus.backends.python.model_args import initialize_args
from oceanus.backends.python.options import PythonOptions
from oceanus.backends.python.server_calls import ServerCalls
from oceanus.backends.python.stub_launcher import IS_READY_CACHE_S, Stub, exit_text, spawn
from oceanus.core.backend import LoadContext, RequestInstance, RequestJob, RequestsResult
from oceanus.core.errors import InferenceServerError, internal, invalid_arg, unavailable
from oceanus.core.observability.custom_metrics import CustomMetricRegistry
from oceanus.core.repository.model_config import sequence_control_types

log = logging.getLogger("oceanus.backends.python")

EXECUTE_TIMEOUT_PARAMETER = "execute_timeout_seconds"
# How long a batch waits for a restarting stub before it fails.
RESTART_WAIT_S = 120.0
# Nobody waits on a stub's socket between batches: a standby thread reads it (log lines, BLS
# calls from the model's own threads) once it has gone unread this long.
STANDBY_AFTER_S = 0.02
# A model's is_ready(): an answer younger than IS_READY_CACHE_S (process.py) is reused; an
# endpoint waits this long for a fresh answer (on the event loop) before it reports the last one;
# a check unanswered this long reports not ready (Triton's 5 s timeout).
IS_READY_WAIT_S = 0.2
IS_READY_TIMEOUT_S = 5.0
# Custom metrics of instances loaded without a running server core (unit tests).
_FALLBACK_METRICS = CustomMetricRegistry()


def _parameter(config: mc.ModelConfig, key: str) -> str | None:
    for name, value in config.parameters.items():
        if name.lower() == key:
            return str(value.string_value)
    return None


class PythonInstance(RequestInstance):
    """A model instance whose model.py runs in a stub process."""

    def __init__(self, context: LoadContext, options: PythonOptions | None = None) -> None:
        config, model_path, spec = context.config, context.files.model_path, context.spec
        server = context.server  # where BLS requests and pb_utils' model calls go
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
        self._state_outputs = [s.output_name for s in config.sequence_batching.state]
        version_dir = model_path.parent
        self._args = initialize_args(context)
        timeout = _parameter(config, EXECUTE_TIMEOUT_PARAMETER)
        try:
            self._execute_timeout = float(timeout) if timeout else 0.0
        except ValueError:
            raise invalid_arg(
                f"model '{config.name}': parameter '{EXECUTE_TIMEOUT_PARAMETER}' must be a "
                f"number of seconds, got '{timeout}'"
            ) from None
        # The model's own environment (EXECUTION_ENV_PATH), unpacked and checked once: a restarted
        # stub reuses it.
        self._python_env = resolve_env(config, version_dir.parent)
        self._options = options or PythonOptions()
        self._capacity = self._options.ring_bytes  # --backend-config=python,shm-default-byte-size
        # A batch this large is "large": it keeps the instance thread and is not sent ahead of
        # others. A sixteenth of the rings' old fixed size (8 MiB) whatever their size at start:
        # rings now start small and grow, and what makes a batch large is the cost of copying it.
        self._large_bytes = max(tp.DEFAULT_RING_BYTES, self._capacity) // 16
        self._metrics = server.custom_metrics if server is not None else _FALLBACK_METRICS
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._closing = False
        self._generation = 0
        self._stub: Stub | None = None
        self._inflight = InFlight(self.name, self.decoupled, self._lock)
        self._dispatch = Dispatcher(
            self._inflight, ServerCalls(server, config.name), self._on_is_ready
        )
        self._keys = itertools.count(1)
        self._last_answer_ns = 0  # when the stub last answered a batch (the instance thread's)
        self._batch_ids = itertools.count(1)
        # Batches sent and completed on the event loop, no instance thread (loop_batches.py):
        # not for decoupled models nor with an execute timeout, which the thread path keeps.
        self.loop_driven = (
            server is not None
            and not self.decoupled
            and not self._execute_timeout
            and small_tensors(config, self._large_bytes)
        )
        self._loop_batches = (
            LoopBatches(self, server.loop, self._large_bytes, RESTART_WAIT_S)
            if server is not None and self.loop_driven
            else None
        )
        self._start()

    # ---- the stub's life --------------------------------------------------------------------

    def _start(self) -> None:
        """Start a stub and wait for its initialize(); raises with the model's error."""
        generation = self._generation + 1
        metrics = self._metrics.owner()

        growth = self._options.growth_bytes  # --backend-config=python,shm-growth-byte-size

        def init(s2w: str, w2s: str, capacity: int, spill_prefix: str) -> msg.Init:
            model = str(self._model_path)
            return msg.Init(
                model, self._args, self.decoupled, s2w, w2s, capacity, spill_prefix, growth
            )

        try:
            stub = spawn(
                self.name,
                generation,
                init,
                self._capacity,
                metrics,
                self._dispatch,
                self._python_env,
                growth,
                self.model_name,
            )
        except BaseException:
            metrics.close()
            raise
        stub.mailbox = tp.Mailbox(
            stub.channel,
            functools.partial(self._on_message, stub),
            stub.process.kill,  # end of file: the stub is gone or broken; the watchdog acts
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
        if self._loop_batches is not None:
            self._loop_batches.stub_started()

    def _on_message(self, stub: Stub, message: msg.Message) -> None:
        self._dispatch(stub, message)
        if self._loop_batches is not None:
            self._loop_batches.dispatched(message)

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

    def _on_is_ready(self, stub: Stub, message: msg.IsReadyAnswer) -> None:
        with self._lock:
            if stub.check_id != message.check_id:
                return
            stub.check_id = None
            stub.checked_at = time.monotonic()
            stub.user_ready = bool(message.ready) and message.error is None
        if message.error is not None:
            log.error("model instance '%s': is_ready() failed: %s", self.name, message.error)

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
            batches, streams = self._inflight.take_all()
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
            for batch in batches:
                batch.result = error
                batch.done = True
            mailbox.cond.notify_all()
        if self._loop_batches is not None:
            self._loop_batches.stub_gone()
        stub.channel.close()  # a thread still reading gets end of file
        mailbox.close()
        stub.metrics.close()
        stub.remove_files()
        # Nothing reads this stub's channel any more once its standby reader has seen the close:
        # its rings and wake-up pipe can go (a restarted stub must not leave them open).
        for thread in stub.threads:
            if thread is not threading.current_thread():
                thread.join(timeout=5)
        mailbox.dispose()
        stub.close_rings()
        for stream in streams:
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
            mailbox.wait(lambda: stub.finalized or mailbox.closed, self._options.stub_timeout_s)
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
        stub.close_rings()
        stub.remove_files()  # a segment or one-off file the stub never got to map
        if self._loop_batches is not None:
            self._loop_batches.close()

    # ---- execution ----------------------------------------------------------------------------

    def submit_on_loop(
        self, jobs: Sequence[RequestJob], done: Callable[[RequestsResult | Exception], None]
    ) -> None:
        assert self._loop_batches is not None
        self._loop_batches.submit(jobs, done)

    @property
    def last_answer_ns(self) -> int:
        return self._last_answer_ns

    def finished(self, batch: Batch) -> None:
        self._inflight.finished(batch)

    def execute_requests(self, jobs: Sequence[RequestJob]) -> RequestsResult:
        return self._send_batch(jobs)()

    def start_requests(self, jobs: Sequence[RequestJob]) -> Callable[[], RequestsResult]:
        """Send the batch to the stub now; the stub executes what it is sent in order, so the
        instance thread can send a group's batches before it waits for the first. A batch with
        large inputs is sent only when awaited (after the ones before it are answered), so the
        batches sent ahead never hold more than a small share of the rings and never spill to
        one-off files where one at a time would not."""
        if sum(a.nbytes for job in jobs for a in job.inputs.values()) > self._large_bytes:
            return functools.partial(self.execute_requests, jobs)
        # Behind a batch not yet answered (the rest of a group), held: they leave together
        # when the first is awaited, in one write (each write from this thread is one more
        # wait for the GIL the event loop holds), while the stub already executes the first.
        return self._send_batch(jobs, hold=bool(self._inflight.batches))

    def _send_batch(
        self, jobs: Sequence[RequestJob], hold: bool = False
    ) -> Callable[[], RequestsResult]:
        started = time.monotonic_ns()
        sent = self._send(jobs, hold)
        assert sent is not None  # waited for a stub
        stub, batch = sent
        return functools.partial(self._result, stub, batch, started, time.monotonic_ns())

    def send_now(self, jobs: Sequence[RequestJob]) -> tuple[Stub, Batch] | None:
        """Send without waiting (loop_batches.py): None while there is no stub to send to."""
        return self._send(jobs, wait=False)

    def _result(self, stub: Stub, batch: Batch, started: int, sent: int) -> RequestsResult:
        """Wait for a sent batch's answer. Its execution began when it was sent or, sent behind
        others, when the one before it was answered."""
        begun = max(sent, self._last_answer_ns)
        with contextlib.suppress(OSError):  # a stub gone: its watchdog fails the batches
            stub.channel.flush()  # the batches held behind this one
        try:
            assert stub.mailbox is not None
            if stub.mailbox.wait(lambda: batch.done, self._execute_timeout or None):
                item = batch.result
            else:
                item = self._timed_out(batch, stub)
        finally:
            self._inflight.finished(batch)
        return self.answered(batch, item, started, sent, begun)

    def answered(
        self, batch: Batch, item: Any, started: int, sent: int, begun: int
    ) -> RequestsResult:
        """A batch's answer (`Batch.result`) as the core wants it; raises the batch's error."""
        if isinstance(item, InferenceServerError):
            self._inflight.forget_streams(batch)  # the core ends them with the error
            raise item
        outputs, parameters, output_ns = item
        done = self._last_answer_ns = time.monotonic_ns()
        return RequestsResult(
            outputs,
            input_ns=sent - started,
            infer_ns=done - begun - output_ns,
            output_ns=output_ns,
            parameters=parameters if any(p is not None for p in parameters) else None,
        )

    def _send(
        self, jobs: Sequence[RequestJob], hold: bool = False, wait: bool = True
    ) -> tuple[Stub, Batch] | None:
        """Send the batch to the current stub (waiting for one while it restarts, unless not
        `wait`: then None); the one place batches leave for a stub."""
        keys = [next(self._keys) for _ in jobs]
        input_types, all_outputs = self._input_types, self._all_outputs
        groups = [
            [(name, input_types[name], array) for name, array in job.inputs.items()] for job in jobs
        ]
        states = self._state_outputs
        heads = [
            request_head(k, j.request, all_outputs, states) for k, j in zip(keys, jobs, strict=True)
        ]
        retried = False
        while True:
            if not self._ready.is_set():
                if not wait:
                    return None
                if not self._ready.wait(RESTART_WAIT_S):
                    raise self.unhealthy()
            batch = Batch(jobs, keys)  # new each try: a dead stub's watchdog fails the last one
            batch.batch_id = batch_id = next(self._batch_ids)
            with self._lock:
                stub = self._stub
                if self._closing or stub is None:
                    raise unavailable("model is being unloaded")
                if not self._ready.is_set():
                    continue  # died just now: wait for the new stub
                self._inflight.add(batch_id, batch)
            try:
                build = functools.partial(exec_message, batch_id, heads)
                stub.channel.send_tensors(stub.writer, groups, build, hold=hold)
            except OSError:
                # The stub died before it got the batch: run the batch on the next one.
                self._inflight.drop(batch_id)
                if not wait:
                    return None
                if retried or not self._wait_replaced(stub):
                    raise self.unhealthy() from None
                retried = True
                continue
            return stub, batch

    def unhealthy(self) -> InferenceServerError:
        return internal(f"Stub process '{self.name}' is not healthy.")

    def _wait_replaced(self, stub: Stub) -> bool:
        """Wait until a new stub replaced `stub` (False: not within RESTART_WAIT_S)."""
        deadline = time.monotonic() + RESTART_WAIT_S
        while time.monotonic() < deadline and not self._closing:
            if self._stub is not stub and self._ready.wait(0.01):
                return True
            time.sleep(0.005)
        return False

    def _timed_out(self, batch: Batch, stub: Stub) -> InferenceServerError:
        self._inflight.drop(batch.batch_id)
        with self._lock:
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
