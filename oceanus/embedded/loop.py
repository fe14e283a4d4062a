"""The core's own event loop, on a thread of the embedding process, lent to callers while idle.

The core is single-threaded by design (statistics, schedulers and futures live on one loop).
A thread that only waits for the loop thread to run its request pays two thread wake-ups per
request, and on machines whose idle CPUs halt (our CI VMs) each costs tens of microseconds, more
than the whole request (docs/embedded.md). So the loop runs on its own thread, but whenever that
thread is idle (blocked in the selector, waiting for sockets, timers or wake-ups) it gives up an
ownership lock; a caller that takes the lock runs the core's code on its own thread, with no
wake-up at all, and hands the loop back. A model cheap enough to execute on the loop then
answers before the caller even releases the lock.

Callers that find the loop busy block on the lock (`call`) or fall back to scheduling onto the
loop thread (`try_call`). Work a caller leaves behind (callbacks, an earlier timer) wakes the
loop thread through its self-pipe, as any other thread's `call_soon_threadsafe` does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import selectors
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class _LendingSelector(selectors.DefaultSelector):
    """The loop's selector: the ownership lock is free exactly while the loop thread waits."""

    def __init__(self, owner: threading.Lock) -> None:
        super().__init__()
        self._owner = owner
        self.wake_at = math.inf  # when the loop thread's current wait ends at the latest

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is not None and timeout <= 0:
            return list(super().select(timeout))  # a poll, not a wait: keep the loop
        self.wake_at = math.inf if timeout is None else time.monotonic() + timeout
        self._owner.release()
        try:
            return list(super().select(timeout))
        finally:
            self._owner.acquire()
            self.wake_at = -math.inf  # running: anything a caller leaves is seen


class CoreLoop:
    """An asyncio loop running on a daemon thread until `close`, lent to callers while idle."""

    def __init__(self, name: str = "oceanus-core") -> None:
        self._owner = threading.Lock()
        self._selector = _LendingSelector(self._owner)
        self.loop = asyncio.SelectorEventLoop(self._selector)
        ready = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(ready,), name=name, daemon=True)
        self._thread.start()
        ready.wait()

    def _main(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self._owner.acquire()
        self.loop.call_soon(ready.set)
        try:
            self.loop.run_forever()
        finally:
            self._owner.release()

    @property
    def on_loop(self) -> bool:
        """Whether the caller is this loop's own thread (where waiting would deadlock)."""
        return threading.current_thread() is self._thread

    def call(self, function: Callable[..., T], *args: Any) -> T:
        """Call a plain function with the loop held: on this thread when the loop is idle (or
        once it is)."""
        if self.on_loop:
            return function(*args)
        with self._owner:
            return self._lent(function, args)

    def try_call(self, function: Callable[..., T], *args: Any) -> bool:
        """Call `function` with the loop held if it is idle now (True), else schedule it on the
        loop thread (False); for callers that must not block (an asyncio caller's loop)."""
        if self.on_loop:
            function(*args)
            return True
        if not self._owner.acquire(blocking=False):
            self.loop.call_soon_threadsafe(function, *args)
            return False
        try:
            self._lent(function, args)
        finally:
            self._owner.release()
        return True

    def _lent(self, function: Callable[..., T], args: tuple[Any, ...]) -> T:
        """Run with the lock held: this thread sees the core's loop as its running loop, and
        the loop thread is woken if the call left work for it."""
        loop = self.loop
        previous = asyncio.events._get_running_loop()
        asyncio.events._set_running_loop(loop)
        try:
            return function(*args)
        finally:
            asyncio.events._set_running_loop(previous)
            if self._left_work():
                loop.call_soon_threadsafe(_nothing)

    def _left_work(self) -> bool:
        """Callbacks ready, or a timer earlier than the loop thread's wait ends."""
        ready = getattr(self.loop, "_ready", None)
        scheduled = getattr(self.loop, "_scheduled", None)
        if ready is None or scheduled is None:  # another asyncio: wake it to be safe
            return True
        if ready:
            return True
        return bool(scheduled) and scheduled[0].when() < self._selector.wake_at

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run a coroutine on the loop thread and wait for its result."""
        if self.on_loop:
            coroutine.close()
            raise RuntimeError("the in-process API cannot wait for the core on the core's loop")
        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(
            coroutine, self.loop
        )
        return future.result(timeout)

    def close(self) -> None:
        """Stop the loop, join its thread, release it (what is still scheduled is dropped)."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


def _nothing() -> None:
    """Scheduled only to wake the loop thread."""
