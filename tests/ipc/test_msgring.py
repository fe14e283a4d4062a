"""The message ring (oceanus/ipc/msgring.py) between two real processes: every frame arrives
whole and in order while the writer wraps the ring many times, and the sleep handshake never
loses a wake-up."""

from __future__ import annotations

import marshal
import os
import select
import signal
import socket
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

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


def _child_publishes_fast(path: str, count: int) -> None:
    writer = msgring.MsgRingWriter(path)
    frames = [frame((index,)) for index in range(count)]
    for data in frames:
        while not writer.put(data):
            pass  # full: the reader makes room
    writer.close()


def test_the_reader_never_sees_a_torn_head(tmp_path: Path) -> None:
    """The writer publishes `head` as fast as it can while the reader reads it as fast as it
    can. With head written by struct.pack_into (it zeroes the word, then stores the value) the
    reader now and then read head 0 and walked past the real head into stale records (here a
    failure about one run in three on a busy 2-core machine; on the real server's link, after
    6,700-20,000 requests)."""
    count = 500_000
    path = str(tmp_path / "ring")
    msgring.create(path, 1 << 20)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            _child_publishes_fast(path, count)
        finally:
            os._exit(0)
    reader = msgring.MsgRingReader(path)
    got = [0]

    def on_frame(data: memoryview) -> None:
        (index,) = marshal.loads(data)
        assert index == got[0], f"frame {index} where {got[0]} was due"
        got[0] += 1

    try:
        while got[0] < count:
            reader.read(on_frame, [])
    finally:
        if got[0] < count:  # failed: the child may be waiting for room that never comes
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        reader.close()


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 230), st.booleans()),  # (payload size, read after the put)
        min_size=1,
        max_size=200,
    )
)
def test_pad_and_wrap_agree_for_any_sizes_and_interleaving(steps: list[tuple[int, bool]]) -> None:
    """One process, a tiny ring: records of every size land at every offset, including within
    4 bytes of the end (no room for PAD's word: the reader skips to the start on its own)."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "ring")
        msgring.create(path, 1024)
        writer, reader = msgring.MsgRingWriter(path), msgring.MsgRingReader(path)
        sent: list[tuple[int, bytes]] = []
        got: list[tuple[int, bytes]] = []
        on_frame = lambda data: got.append(marshal.loads(data))  # noqa: E731
        for index, (size, read_now) in enumerate(steps):
            data = frame((index, b"y" * size))
            while not writer.put(data):  # full: read to make room
                assert reader.read(on_frame, []), "no room and nothing to read"
            sent.append((index, b"y" * size))
            if read_now:
                reader.read(on_frame, [])
        reader.read(on_frame, [])
        assert got == sent
        writer.close()
        reader.close()
