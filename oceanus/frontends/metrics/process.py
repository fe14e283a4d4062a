"""The server's own processes and connections, for the status page (Linux /proc; elsewhere the
numbers are absent).

The server is more than one process: frontend workers (`--frontend-workers`) and Python backend
stubs are children of the core process, so CPU time and resident memory are summed over the core
process and all its descendants. Open connections are counted from the kernel's socket tables
(`/proc/net/tcp`, `/proc/net/tcp6`): established sockets whose local port is a port the server
serves, which counts them wherever they live (in the core or in a worker).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

_ESTABLISHED = "01"


@dataclass(frozen=True)
class ProcessSample:
    at: float  # time.monotonic() of the reading
    cpu_seconds: float  # user + system time of the core process and its descendants
    rss_bytes: int  # summed resident set sizes (shared pages count once per process)
    processes: int


def descendants(pid: int, proc: Path = Path("/proc")) -> list[int]:
    """`pid` and every process below it (through /proc/<pid>/task/<tid>/children)."""
    found = [pid]
    index = 0
    while index < len(found):
        current = found[index]
        index += 1
        try:
            tasks = list((proc / str(current) / "task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                text = (task / "children").read_text()
            except OSError:
                continue
            found.extend(int(child) for child in text.split())
    return found


def read_stat(pid: int, proc: Path = Path("/proc")) -> tuple[int, int] | None:
    """(utime + stime in clock ticks, rss in pages) of one process, None if it is gone."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = text[text.rfind(")") + 2 :].split()
    try:
        # fields[0] is field 3 (state): utime is field 14, stime 15, rss 24.
        return int(fields[11]) + int(fields[12]), int(fields[21])
    except (IndexError, ValueError):
        return None


def count_connections(
    ports: Mapping[int, str], tables: Iterable[Path] = (), proc: Path = Path("/proc")
) -> dict[str, int] | None:
    """Established TCP connections per name of the local port they arrived on, or None where
    the socket tables cannot be read."""
    counts = dict.fromkeys(ports.values(), 0)
    wanted = {f"{port:04X}": name for port, name in ports.items() if port > 0}
    paths = list(tables) or [proc / "net" / "tcp", proc / "net" / "tcp6"]
    readable = False
    for path in paths:
        try:
            with open(path, encoding="ascii") as handle:
                next(handle, None)  # the header line
                readable = True
                for line in handle:
                    fields = line.split(None, 4)
                    if len(fields) < 4 or fields[3] != _ESTABLISHED:
                        continue
                    name = wanted.get(fields[1].rpartition(":")[2])
                    if name is not None:
                        counts[name] += 1
        except OSError:
            continue
    return counts if readable else None


class ProcessSampler:
    """Readings of the server's processes, at most one per `min_interval_s` (a page polling
    every second from several browsers costs one /proc walk per interval)."""

    def __init__(self, pid: int | None = None, min_interval_s: float = 0.5) -> None:
        self.pid = os.getpid() if pid is None else pid
        self.min_interval_s = min_interval_s
        self._ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._linux = Path("/proc/self/stat").exists()
        self.latest: ProcessSample | None = None
        self.previous: ProcessSample | None = None

    def sample(self) -> ProcessSample:
        """A fresh reading (or the latest, when it is younger than `min_interval_s`); blocking."""
        now = time.monotonic()
        latest = self.latest
        if latest is not None and now - latest.at < self.min_interval_s:
            return latest
        if self._linux:
            ticks = pages = count = 0
            for pid in descendants(self.pid):
                stat = read_stat(pid)
                if stat is not None:
                    ticks += stat[0]
                    pages += stat[1]
                    count += 1
            reading = ProcessSample(now, ticks / self._ticks, pages * self._page, count)
        else:  # no /proc: this process only, no memory figure
            times = os.times()
            reading = ProcessSample(now, times.user + times.system, 0, 1)
        self.previous, self.latest = latest, reading
        return reading

    def cpu_percent(self) -> float | None:
        """CPU use between the last two readings, in percent of one core (200 = two cores)."""
        latest, previous = self.latest, self.previous
        if latest is None or previous is None or latest.at <= previous.at:
            return None
        spent = latest.cpu_seconds - previous.cpu_seconds
        return max(0.0, 100.0 * spent / (latest.at - previous.at))
