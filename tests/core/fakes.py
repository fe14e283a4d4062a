"""A backend whose execution the test controls, a clock the test drives, and a core to run them.

The fake backends are registered through the public registry (`BackendRegistry` and
`BackendSpec`, as a third-party package registers one) and served by the real `ServerCore`:
repository scan, config parsing and normalization, validation, schedulers, instance threads and
statistics are the production code; only the model's arithmetic is the test's.

- `fake` instances are `BatchInstance`s: each records the batch it gets (which instance, the
  assembled inputs), can be held until the test releases it, fails on demand, and answers each
  output with the input at the same position (or what `FakeModel.compute` returns).
- `fake_requests` instances are `RequestInstance`s: they get the requests themselves and may
  answer one of them with its own error.
- `ManualClock` is the core's clock in these tests: time moves only when the test advances it,
  and the timers the schedulers arm (max_queue_delay, queue timeouts, sequence idle timeouts)
  fire then, in order. Nothing here sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.core import datatypes as core_datatypes
from oceanus.core.backend import (
    Arrays,
    Backend,
    BackendInstance,
    BatchInstance,
    LoadContext,
    RequestInstance,
    RequestJob,
    RequestsResult,
)
from oceanus.core.backend_registry import BackendRegistry, BackendSpec
from oceanus.core.errors import InferenceServerError
from oceanus.core.model import ModelVersion
from oceanus.core.server import CoreOptions, ServerCore
from oceanus.core.types import InferRequest, InferResponse, Tensor

# How long a test waits for something that happens within milliseconds (an instance thread
# picking a batch up) before it fails instead of hanging; never a delay anything relies on.
EVENT_TIMEOUT_S = 30.0
# The manual clock starts here, far from 0 so that no timestamp is mistaken for "unset".
CLOCK_START_NS = 1_000_000_000_000


# ---- the clock --------------------------------------------------------------------------------


class ManualTimer:
    __slots__ = ("callback", "cancelled", "when_ns")

    def __init__(self, when_ns: int, callback: Callable[[], object]) -> None:
        self.when_ns = when_ns
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A `Clock` (oceanus/core/clock.py) whose time moves only when the test says so."""

    # A callback that keeps arming a timer that is already due would make `advance` spin:
    # that is a scheduler bug, reported instead of hanging the test.
    MAX_FIRINGS_PER_ADVANCE = 10_000

    def __init__(self, start_ns: int = CLOCK_START_NS) -> None:
        self._now = start_ns
        self._timers: list[tuple[int, int, ManualTimer]] = []
        self._order = itertools.count()

    def now_ns(self) -> int:
        return self._now

    def call_at(self, when_ns: int, callback: Callable[[], object]) -> ManualTimer:
        timer = ManualTimer(when_ns, callback)
        heapq.heappush(self._timers, (when_ns, next(self._order), timer))
        return timer

    def pending(self) -> list[int]:
        """When the armed, not cancelled timers are due (ns since the clock's start)."""
        return sorted(t.when_ns - CLOCK_START_NS for _, _, t in self._timers if not t.cancelled)

    def advance(self, ns: int) -> None:
        """Move time forward by `ns`, firing every timer that falls due on the way, each at
        its own time. Call it on the event loop (timers fire where the loop would run them)."""
        target = self._now + ns
        fired = 0
        while self._timers and self._timers[0][0] <= target:
            when, _, timer = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            fired += 1
            if fired > self.MAX_FIRINGS_PER_ADVANCE:
                raise RuntimeError("timers keep re-arming at a time already due")
            self._now = max(self._now, when)
            timer.callback()
        self._now = target

    def advance_us(self, us: int) -> None:
        self.advance(us * 1000)

    def tick(self, ns: int) -> None:
        """Move time without firing timers: a fake execution taking `ns` (any thread)."""
        self._now += ns


# ---- the fake backends --------------------------------------------------------------------------


@dataclass
class Executed:
    """One execution as an instance saw it."""

    instance: str
    inputs: Arrays  # the assembled batch (batch style) or the first request's inputs
    rows: int
    request_ids: list[str] = field(default_factory=list)  # request style: the requests, in order
    # Where it ran: the instance's thread (named as the instance) or the event loop's.
    thread: str = field(default_factory=lambda: threading.current_thread().name)


Compute = Callable[[Arrays, str], Arrays]


class FakeModel:
    """What the test controls of one model's instances (all of its versions)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.executed: list[Executed] = []
        self.loads = 0
        # How outputs are made from the inputs (default: output i = input i, see `_outputs`).
        self.compute: Compute | None = None
        # Instances (by name) whose every execution fails with this error.
        self.failing_instances: dict[str, Exception] = {}
        # Errors the next executions raise, in order (any instance).
        self.next_failures: list[Exception] = []
        # Request style: requests (by id) answered with their own error.
        self.request_errors: dict[str, InferenceServerError] = {}
        # How long each execution takes on the manual clock (`ManualClock.tick`).
        self.execution_ns = 0
        self.clock: ManualClock | None = None
        self.load_error: Exception | None = None
        self._lock = threading.Condition()
        self._held = False
        self._permits: dict[str | None, int] = {}  # instance (None: any) -> count
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Event | None = None

    # -- the test's side (on the event loop)

    def hold(self) -> None:
        """From now on every execution waits, after it is recorded, until released."""
        with self._lock:
            self._held = True

    def release(self, count: int = 1, instance: str | None = None) -> None:
        """Let `count` held executions (present or future; of `instance` only, if named)
        finish."""
        with self._lock:
            self._permits[instance] = self._permits.get(instance, 0) + count
            self._lock.notify_all()

    def release_all(self) -> None:
        with self._lock:
            self._held = False
            self._lock.notify_all()

    async def wait_executions(self, count: int) -> list[Executed]:
        """Until `count` executions have started (in total, since load)."""
        assert self._changed is not None, f"model '{self.name}' has no loaded instance"
        changed = self._changed

        async def reached() -> None:
            while len(self.executed) < count:
                changed.clear()
                if len(self.executed) >= count:
                    break
                await changed.wait()

        await asyncio.wait_for(reached(), EVENT_TIMEOUT_S)
        return self.executed[:count]

    def batch_rows(self) -> list[int]:
        return [e.rows for e in self.executed]

    # -- the instances' side (instance threads)

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._loop is not loop:
            self._loop = loop
            self._changed = asyncio.Event()

    def record(self, executed: Executed) -> None:
        with self._lock:
            self.executed.append(executed)
        loop, changed = self._loop, self._changed
        if loop is not None and changed is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: the test is over
                loop.call_soon_threadsafe(changed.set)
        instance = executed.instance
        with self._lock:
            while self._held and not (self._permits.get(instance) or self._permits.get(None)):
                self._lock.wait()
            if self._held:
                key = instance if self._permits.get(instance) else None
                self._permits[key] -= 1
        if self.execution_ns and self.clock is not None:
            self.clock.tick(self.execution_ns)

    def fail_if_asked(self, instance: str) -> None:
        error = self.failing_instances.get(instance)
        if error is None and self.next_failures:
            error = self.next_failures.pop(0)
        if error is not None:
            raise error

    def outputs(self, config: mc.ModelConfig, inputs: Arrays, instance: str) -> Arrays:
        if self.compute is not None:
            return self.compute(inputs, instance)
        given = [inputs[t.name] for t in config.input if t.name in inputs]
        return {t.name: given[i].copy() for i, t in enumerate(config.output) if i < len(given)}


class FakeBatchInstance(BatchInstance):
    # Never on the event loop: a held execution would block the loop the test runs on.
    loop_safe: ClassVar[bool] = False

    def __init__(self, model: FakeModel, context: LoadContext) -> None:
        self.model = model
        self.config = context.config
        self.name = context.spec.name

    def execute(self, inputs: Arrays) -> Arrays:
        rows = next(iter(inputs.values())).shape[0] if self.config.max_batch_size > 0 else 1
        self.model.record(Executed(self.name, inputs, rows))
        self.model.fail_if_asked(self.name)
        return self.model.outputs(self.config, inputs, self.name)


class CheapBatchInstance(FakeBatchInstance):
    """A fake cheap enough for the event loop (core/scheduling/instance.py's inline path)."""

    loop_safe: ClassVar[bool] = True


class FakeRequestInstance(RequestInstance):
    def __init__(self, model: FakeModel, context: LoadContext) -> None:
        self.model = model
        self.config = context.config
        self.name = context.spec.name

    def execute_requests(self, jobs: Sequence[RequestJob]) -> RequestsResult:
        ids = [job.request.id for job in jobs]
        first = dict(jobs[0].inputs) if jobs else {}
        self.model.record(Executed(self.name, first, len(jobs), ids))
        self.model.fail_if_asked(self.name)
        answers: list[Arrays | InferenceServerError] = []
        for job in jobs:
            error = self.model.request_errors.get(job.request.id)
            if error is None:
                try:  # a `compute` raising InferenceServerError answers this request only
                    answers.append(self.model.outputs(self.config, dict(job.inputs), self.name))
                except InferenceServerError as exc:
                    answers.append(exc)
            else:
                answers.append(error)
        return RequestsResult(answers)


MakeInstance = Callable[[FakeModel, LoadContext], BackendInstance]


class FakeBackend(Backend):
    name: ClassVar[str] = "fake"
    default_model_filename: ClassVar[str] = "model.fake"

    def __init__(self, fakes: Fakes, instance_type: MakeInstance) -> None:
        self._fakes = fakes
        self._instance_type = instance_type

    def load(self, context: LoadContext) -> BackendInstance:
        model = self._fakes.model(context.config.name)
        if model.load_error is not None:
            raise model.load_error
        model.loads += 1
        if context.server is not None:
            model.attach(context.server.loop)
        model.clock = self._fakes.clock
        return self._instance_type(model, context)


class Fakes:
    """The fake backends' shared state: one `FakeModel` per model name."""

    # Backend name -> the instance type its models get.
    BACKENDS: ClassVar[dict[str, MakeInstance]] = {
        "fake": FakeBatchInstance,
        "fake_cheap": CheapBatchInstance,
        "fake_requests": FakeRequestInstance,
    }

    def __init__(self, clock: ManualClock | None = None) -> None:
        self.clock = clock
        self._models: dict[str, FakeModel] = {}
        self._lock = threading.Lock()  # loader threads load several models at once

    def model(self, name: str) -> FakeModel:
        with self._lock:
            found = self._models.get(name)
            if found is None:
                found = self._models[name] = FakeModel(name)
            return found

    def specs(self) -> list[BackendSpec]:
        return [
            BackendSpec(
                name,
                (lambda instance_type=instance_type: FakeBackend(self, instance_type)),
                model_files={f"model.{name}": ""},
            )
            for name, instance_type in self.BACKENDS.items()
        ]

    def registry(self) -> BackendRegistry:
        return BackendRegistry(self.specs())

    def release_everything(self) -> None:
        for model in list(self._models.values()):
            model.release_all()


# ---- models on disk -----------------------------------------------------------------------------


def write_model(
    repository: Path,
    name: str,
    body: str,
    *,
    backend: str = "fake",
    max_batch_size: int = 0,
    versions: Iterable[int] = (1,),
) -> Path:
    """A model folder served by a fake backend: config.pbtxt (name, backend, max_batch_size,
    then `body`) and a placeholder model file in each version folder."""
    folder = repository / name
    folder.mkdir(parents=True, exist_ok=True)
    header = f'name: "{name}"\n'
    if backend:
        header += f'backend: "{backend}"\n'
    header += f"max_batch_size: {max_batch_size}\n"
    (folder / "config.pbtxt").write_text(header + body)
    for version in versions:
        (folder / str(version)).mkdir(exist_ok=True)
        (folder / str(version) / "model.fake").write_text("fake")
    return folder


# A one-input, one-output FP32 model with 4 elements per row (output = input by default).
IO_FP32 = """
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


# ---- the core -----------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def running_core(
    repository: Path,
    fakes: Fakes,
    **options: Any,
) -> AsyncIterator[ServerCore]:
    """A started `ServerCore` over `repository` with the fake backends (and the fakes' clock);
    on the way out every held execution is released and the core shuts down."""
    if fakes.clock is not None:
        options.setdefault("clock", fakes.clock)
    core = ServerCore(CoreOptions([repository], backends=fakes.registry(), **options))
    await core.start()
    try:
        yield core
    except BaseException:
        # A failed test may leave requests queued, which an unload would wait for forever.
        for entry in core.models.values():
            for version in entry.versions.values():
                if version.scheduler is not None:
                    version.scheduler.close()
        raise
    finally:
        fakes.release_everything()
        await core.shutdown()


def request(
    model: str,
    inputs: dict[str, np.ndarray],
    *,
    clock: ManualClock | None = None,
    types: dict[str, str] | None = None,
    **fields: Any,
) -> InferRequest:
    """An InferRequest as a frontend would build it (received now, on `clock` if given)."""
    tensors = []
    for name, array in inputs.items():
        datatype = (types or {}).get(name) or _datatype(array)
        tensors.append(Tensor(name, datatype, tuple(array.shape), array))
    if clock is not None:
        fields.setdefault("received_ns", clock.now_ns())
    return InferRequest(model_name=model, inputs=tensors, **fields)


def _datatype(array: np.ndarray) -> str:
    found = core_datatypes.from_numpy(array.dtype)
    return found.name if found is not None else "BYTES"


def rows(count: int = 1, value: float = 1.0, width: int = 4) -> dict[str, np.ndarray]:
    """Inputs of `IO_FP32`: `count` rows of `value`."""
    return {"IN": np.full((count, width), value, dtype=np.float32)}


def scheduler_of(core: ServerCore, model: str) -> Any:
    """The version's scheduler, for the counts metrics read too (queued, pending)."""
    version: ModelVersion = core.resolve(model)
    return version.scheduler


async def until(predicate: Callable[[], bool]) -> None:
    """Yield to the loop until `predicate` holds, for states no event announces (what the
    loop does with a batch an instance thread handed back). Yields, never sleeps for a time."""
    deadline = asyncio.get_running_loop().time() + EVENT_TIMEOUT_S
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("the awaited state never came")
        await asyncio.sleep(0)


async def outcome(future: asyncio.Future[InferResponse]) -> InferResponse | InferenceServerError:
    """The response, or the error the request failed with."""
    try:
        return await asyncio.wait_for(asyncio.shield(future), EVENT_TIMEOUT_S)
    except InferenceServerError as exc:
        return exc


# ---- one test's world ---------------------------------------------------------------------------

T = TypeVar("T")


@dataclass
class World:
    """A repository of fake models, their controls and the manual clock of one test; `run`
    starts a core over them and runs the test's scenario on it."""

    repository: Path
    clock: ManualClock = field(default_factory=ManualClock)
    fakes: Fakes = field(init=False)

    def __post_init__(self) -> None:
        self.fakes = Fakes(self.clock)

    def add(self, name: str, body: str = IO_FP32, **kwargs: Any) -> Path:
        return write_model(self.repository, name, body, **kwargs)

    def model(self, name: str) -> FakeModel:
        return self.fakes.model(name)

    def request(self, model: str, inputs: dict[str, np.ndarray], **fields: Any) -> InferRequest:
        return request(model, inputs, clock=self.clock, **fields)

    def run(self, scenario: Callable[[ServerCore], Awaitable[T]], **options: Any) -> T:
        async def main() -> T:
            async with running_core(self.repository, self.fakes, **options) as core:
                return await scenario(core)

        return asyncio.run(main())
