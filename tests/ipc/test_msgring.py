"""The message ring (oceanus/ipc/msgring.py) between two real processes: every frame arrives
whole and in order while the writer wraps the ring many times, and the sleep handshake never
loses a wake-up."""

from __future__ import annotations

import marshal
import os
import select
import socket
from pathlib import Path

from oceanus.ipc import msgring
from oceanus.ipc.channel import frame

COUNT = 100_000


def _child_writes(path: str, doorbell: socket.socket) -> None:
    writer = msgring.MsgRingWriter(path)
    for index in range(COUNT):
        data = frame((index, b"x" * (index % 700)))
        while not writer.put(data):  # full: the reader will make room
            os.sched_yield()
        if writer.wants_doorbell():
            doorbell.send(b"\0")
    writer.close()


def test_frames_cross_between_processes_whole_and_in_order(tmp_path: Path) -> None:
    path = str(tmp_path / "ring")
    msgring.create(path, 16 << 10)  # small: wraps about 2000 times
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            ours.close()
            _child_writes(path, theirs)
        finally:
            os._exit(0)
    theirs.close()
    reader = msgring.MsgRingReader(path)
    got: list[int] = []

    def on_frame(data: memoryview) -> None:
        index, payload = marshal.loads(data)
        assert len(payload) == index % 700
        got.append(index)

    poll = select.poll()
    poll.register(ours.fileno(), select.POLLIN)
    spins = 0
    while len(got) < COUNT:
        if reader.read(on_frame, []):
            spins = 0
            continue
        spins += 1
        if spins < 100:
            continue
        if reader.arm():  # a frame came as it armed
            reader.disarm()
            continue
        # Asleep: only a doorbell wakes it (a lost wake-up would hang here: 30 s, then fail).
        assert poll.poll(30_000), f"no doorbell after {len(got)} frames"
        ours.recv(4096)
        reader.disarm()
    os.waitpid(pid, 0)
    assert got == list(range(COUNT))
    reader.close()
