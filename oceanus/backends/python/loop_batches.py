"""A Python model's batches driven by the event loop: sent to the stub and completed on the loop,
with no instance thread in between (`RequestInstance.loop_driven`, core/scheduling/instance.py).

On the thread path every batch costs the server the instance thread's Python under the GIL the
event loop also needs, and a GIL hand-off each time the thread wakes (for its queue, a write, an
answer); over HTTP that, not the Python itself, was what bounded a one-request-per-execute model
(docs/python-backend.md, issue 28). Here the loop writes each batch to the stub's ring and
channel at once (the stub executes what it is sent in order) and watches the stub's socket with
`add_reader`: it reads the answers itself and completes each batch as its Result arrives.

Only for models that are not decoupled and have no execute timeout (those keep the thread).
What another thread of the instance reads meanwhile (the standby reader, `is_ready`, close) is
dispatched as before and completed here at the loop's next turn. A batch with large inputs is
sent only once the ones before it are answered (as on the thread path: batches sent ahead never
fill the ring), and batches wait here, unsent, while a stub restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tritonclient.grpc import model_config_pb2 as mc

from oceanus.backends.python.batches import Batch
from oceanus.backends.python.stub_launcher import Stub
from oceanus.core import datatypes
from oceanus.core.backend import RequestJob, RequestsResult
from oceanus.core.errors import unavailable

if TYPE_CHECKING:
    from oceanus.backends.python.instance import PythonInstance

Done = Callable[[RequestsResult | Exception], None]


def small_tensors(config: mc.ModelConfig, limit: int) -> bool:
    """Whether a batch's inputs and outputs are known to stay under `limit` bytes (fixed
    shapes of fixed-size datatypes). Larger ones keep the instance thread: their copies into
    and out of the rings would run on the event loop (4 MiB tensors: 0.89x on the loop)."""
    rows = max(config.max_batch_size, 1)
    total = 0
    for spec in [*config.input, *config.output]:
        if any(d < 0 for d in spec.dims):
            continue  # variable: not known here
        found = datatypes.BY_NAME.get(mc.DataType.Name(spec.data_type)[5:])
        if found is None or found.dtype.kind == "O":
            continue  # BYTES: not known here
        count = rows
        for d in spec.dims:
            count *= d
        total += count * found.dtype.itemsize
    return total <= limit


class _Entry:
    __slots__ = ("batch", "done", "jobs", "large", "sent", "started")

    def __init__(self, jobs: Sequence[RequestJob], done: Done, large: bool) -> None:
        self.jobs = jobs
        self.done = done
        self.large = large
        self.started = time.monotonic_ns()
        self.sent = 0
        self.batch: Batch | None = None


class LoopBatches:
    """The batches one instance has on the loop: sent and waiting for their Result, in the
    order the stub answers them, and not sent yet."""

    def __init__(
        self,
        instance: PythonInstance,
        loop: asyncio.AbstractEventLoop,
        large_bytes: int,
        restart_wait_s: float,
    ) -> None:
        self._instance = instance
        self._loop = loop
        self._large_bytes = large_bytes
        self._restart_wait_ns = int(restart_wait_s * 1e9)
        self._pending: deque[_Entry] = deque()
        self._waiting: deque[_Entry] = deque()
        self._watched: Stub | None = None
        self._fd = -1
        self._loop_thread = -1  # known at the first batch (this is made on a loader thread)
        self._reading = False  # in `_readable`, on the loop
        self._expiry: asyncio.TimerHandle | None = None

    # ---- on the loop --------------------------------------------------------------------------

    def submit(self, jobs: Sequence[RequestJob], done: Done) -> None:
        self._loop_thread = threading.get_ident()
        large = sum(a.nbytes for job in jobs for a in job.inputs.values()) > self._large_bytes
        self._waiting.append(_Entry(jobs, done, large))
        self._send_waiting()

    def _send_waiting(self) -> None:
        waiting = self._waiting
        while waiting:
            entry = waiting[0]
            if entry.large and self._pending:
                return  # sent once the ones before it are answered
            try:
                sent = self._instance.send_now(entry.jobs)
            except Exception as exc:  # unloading
                waiting.popleft()
                entry.done(exc)
                continue
            if sent is None:  # no stub now: stub_started() sends them
                if self._expiry is None:
                    self._expiry = self._loop.call_later(self._restart_wait_ns / 1e9, self._expire)
                return
            waiting.popleft()
            stub, entry.batch = sent
            entry.sent = time.monotonic_ns()
            self._pending.append(entry)
            if self._watched is not stub:
                self._watch(stub)

    def _expire(self) -> None:
        """Batches that waited for a restarting stub as long as the thread path would."""
        self._expiry = None
        now = time.monotonic_ns()
        while self._waiting and now - self._waiting[0].started >= self._restart_wait_ns:
            self._waiting.popleft().done(self._instance.unhealthy())
        if self._waiting:
            self._send_waiting()

    def _watch(self, stub: Stub) -> None:
        self._unwatch()
        # A duplicate of the socket's descriptor: the watchdog closes the channel's own when the
        # stub dies, and the loop's registration must never outlive the descriptor it names.
        self._fd = os.dup(stub.channel.sock.fileno())
        self._loop.add_reader(self._fd, self._readable, stub)
        # uvloop makes a watched descriptor non-blocking, and the duplicate shares that mode
        # with the channel's socket, which the instance's threads read and write blocking.
        os.set_blocking(self._fd, True)
        self._watched = stub

    def _unwatch(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(RuntimeError):  # the loop is closed already
                self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
        self._watched = None

    def _readable(self, stub: Stub) -> None:
        mailbox = stub.mailbox
        self._reading = True
        try:
            alive = mailbox is not None and mailbox.read_ready()
        finally:
            self._reading = False
        if not alive and stub is self._watched:
            self._unwatch()  # the watchdog fails its batches and restarts it
        self._drain()

    def _read_watched(self) -> None:
        if self._watched is not None:
            self._readable(self._watched)
        else:
            self._drain()

    def _drain(self) -> None:
        """Complete the batches answered, in order; then send what waited."""
        pending, instance = self._pending, self._instance
        while pending:
            batch = pending[0].batch
            assert batch is not None
            if not batch.done:
                break
            entry = pending.popleft()
            instance.finished(batch)
            begun = max(entry.sent, instance.last_answer_ns)
            answer: RequestsResult | Exception
            try:
                answer = instance.answered(batch, batch.result, entry.started, entry.sent, begun)
            except Exception as exc:
                answer = exc
            entry.done(answer)
        if self._waiting:
            self._send_waiting()

    def _close(self) -> None:
        self._unwatch()
        if self._expiry is not None:
            self._expiry.cancel()
        while self._waiting:
            self._waiting.popleft().done(unavailable("model is being unloaded"))

    # ---- from any thread ----------------------------------------------------------------------

    def dispatched(self, message: Any) -> None:
        """A message was dispatched: unless `_readable` read it, the loop reads what the
        reader left buffered and completes what was answered, at its next turn (another thread,
        or a wait on the loop itself such as a model's `is_ready`, read it)."""
        # Not only while batches are pending: a Result may be read between its Exec's write
        # and the batch's entry in `_pending` (the standby reader, blocked in recv after an
        # idle spell, reads it at once).
        if not (self._reading and threading.get_ident() == self._loop_thread):
            self._call(self._read_watched)

    def stub_started(self) -> None:
        self._call(self._send_waiting)

    def stub_gone(self) -> None:
        """Its batches were failed (Batch.result): complete them."""
        self._call(self._drain)

    def close(self) -> None:
        if not self._call(self._close):
            self._unwatch()

    def _call(self, callback: Callable[[], None]) -> bool:
        try:
            self._loop.call_soon_threadsafe(callback)
        except RuntimeError:  # the loop is closed: nothing is waiting on it any more
            return False
        return True
