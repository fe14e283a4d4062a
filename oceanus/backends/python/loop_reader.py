"""The event loop as the reader of a stub's channel, for loop-driven instances.

A loop-driven instance (instance.py, `start_requests`) sends each batch from the event loop and
never waits for it: the loop watches the stub's socket (`add_reader`) and dispatches what comes
(mailbox.read_available), so a batch's result completes it on the loop. Per request that saves
the two thread hand-offs loop -> instance thread -> loop of the threaded path: one wake-up in the
server instead of three (docs/python-backend.md, "Performance").

A waiter on another thread (an is_ready check, close) still reads the channel itself while the
loop does not. Before a stub's socket closes, the loop's reader is removed on the loop, so its
file number, reused by the next stub's socket, is never watched by mistake.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable

from oceanus.backends.python.stub_launcher import Stub

# How long a thread waits for the loop to remove its reader (a stopped loop never does).
REMOVE_WAIT_S = 1.0


class LoopReader:
    """Watches the stubs' channels of one instance from the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, lock: threading.Lock) -> None:
        self.loop = loop
        self._lock = lock  # the instance's: guards each stub's `watch`
        self._thread = -1  # the loop's thread, known once it ran one of our callbacks

    def on_loop(self) -> bool:
        return threading.get_ident() == self._thread

    def call(self, callback: Callable[[], None]) -> None:
        """Run `callback` on the loop soon, from any thread (dropped once the loop is closed)."""
        if self.on_loop():
            self.loop.call_soon(callback)
        else:
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(callback)

    def watch(self, stub: Stub) -> None:
        stub.watch = "pending"

        def add() -> None:
            self._thread = threading.get_ident()
            with self._lock:
                if stub.watch != "pending":
                    return  # gone meanwhile
                stub.watch = "on"
            fd = stub.channel.sock.fileno()
            self.loop.add_reader(fd, self._readable, stub)
            # uvloop (libuv) made the socket non-blocking: the channel's threads expect it
            # blocking (a waiter's recv, sendall), and the loop reads only once it is readable.
            os.set_blocking(fd, True)

        self.loop.call_soon_threadsafe(add)

    def _readable(self, stub: Stub) -> None:
        mailbox = stub.mailbox
        if mailbox is None or not mailbox.read_available():
            self.unwatch(stub)  # end of file: the watchdog does the rest

    def unwatch(self, stub: Stub) -> None:
        """Remove the loop's reader from a stub's channel (before the channel closes)."""
        with self._lock:
            if stub.watch == "pending":
                stub.watch = "off"
            if stub.watch != "on":
                return
        if self.on_loop():
            self._remove(stub)
            return
        removed = threading.Event()

        def remove() -> None:
            self._remove(stub)
            removed.set()

        try:
            self.loop.call_soon_threadsafe(remove)
        except RuntimeError:  # the loop is closed: nothing reads any more
            return
        removed.wait(REMOVE_WAIT_S)

    def _remove(self, stub: Stub) -> None:
        with self._lock:
            if stub.watch != "on":
                return
            stub.watch = "off"
        with contextlib.suppress(Exception):  # a closed loop
            self.loop.remove_reader(stub.channel.sock.fileno())
