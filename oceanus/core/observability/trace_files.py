"""Trace files: one background thread performs every write, in order, so that the event loop
never waits on the disk (tracing.py decides what is written and when)."""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
from collections.abc import Callable

log = logging.getLogger("oceanus.trace")


class TraceWriter:
    """One background thread that performs every file write, in order."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, job: Callable[[], None]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="oceanus-trace", daemon=True)
            self._thread.start()
        self._jobs.put(job)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job()
            except OSError as exc:
                log.error("failed creating trace file: %s", exc)

    def close(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None


class TraceFile:
    """`trace_file` (one JSON array, closed at shutdown) and its indexed siblings."""

    def __init__(self, name: str, writer: TraceWriter) -> None:
        self.name = name
        self._writer = writer
        self._index = itertools.count()
        self._opened = False  # only touched by the writer thread

    def save(self, text: str, indexed: bool) -> None:
        if not self.name:
            return
        if indexed:
            path = f"{self.name}.{next(self._index)}"
            self._writer.submit(lambda: _write_file(path, "[" + text + "]"))
        else:
            self._writer.submit(lambda: self._append(text))

    def _append(self, text: str) -> None:
        with open(self.name, "a" if self._opened else "w", encoding="utf-8") as out:
            out.write(("," if self._opened else "[") + text)
        self._opened = True

    def close(self) -> None:
        def end() -> None:
            if self._opened:
                with open(self.name, "a", encoding="utf-8") as out:
                    out.write("]")

        if self.name:
            self._writer.submit(end)


def _write_file(path: str, text: str) -> None:
    """Write whole or not at all: a reader never sees a half-written indexed trace file."""
    partial = path + ".partial"
    with open(partial, "w", encoding="utf-8") as out:
        out.write(text)
    os.replace(partial, path)
