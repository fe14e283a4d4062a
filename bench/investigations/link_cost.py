"""What the frontend worker <-> core link costs per message and per wake-up (issue 27).

Two figures, in CPU-µs (process time, so a busy shared machine inflates them little):

- per message: what the core does with one `simple` request that crossed the link, in Python,
  without the socket: unframe + marshal.loads + decode_request, then encode_response +
  marshal.dumps + frame of its answer (frontends/workers/messages.py, the real functions);
  and what one message costs through a message ring while its reader is awake (no doorbell);
- per wake-up: a child process sleeping in poll() on one end of a Unix socketpair, woken by a
  write from this process, which it answers with a write that wakes this one: the CPU time of
  both processes per round trip, with 1 and with 16 messages per write (the batching the link
  gets under load: the wake-up is paid once per write, not per message).

    python bench/investigations/link_cost.py [--rounds 20000]
"""

from __future__ import annotations

import argparse
import marshal
import os
import resource
import select
import socket
import struct
import sys
import time
from typing import Any

import numpy as np

from oceanus.core.types import InferRequest, InferResponse, Tensor
from oceanus.frontends.workers import messages as m
from oceanus.ipc.channel import frame

_LENGTH = struct.Struct("<I")


def _simple_messages() -> tuple[tuple[Any, ...], InferResponse]:
    data = np.arange(16, dtype=np.int32).reshape(1, 16)
    request = InferRequest(
        model_name="simple",
        model_version="",
        id="",
        inputs=[Tensor(f"INPUT{i}", "INT32", (1, 16), data, {}) for i in range(2)],
        outputs=None,
        parameters={},
        received_ns=0,
    )
    response = InferResponse(
        model_name="simple",
        model_version="1",
        id="",
        outputs=[Tensor(f"OUTPUT{i}", "INT32", (1, 16), data) for i in range(2)],
        requested=None,
        parameters={},
    )
    fields, block = m.place_request(m.encode_request(request), None)
    return m.Infer(1, "http", fields, block), response


def per_message(rounds: int) -> float:
    """CPU-µs the core spends on one request's two messages, codec only."""
    message, response = _simple_messages()
    framed = frame(message)
    start = time.process_time()
    for _ in range(rounds):
        (length,) = _LENGTH.unpack_from(framed, 0)
        received = m.KINDS.decode(marshal.loads(memoryview(framed)[4 : 4 + length]))
        m.decode_request(received.request)
        fields, block = m.encode_response(response)
        answer = frame(m.InferOk(received.id, fields, block))  # the framing is part of the cost
        del answer
    return (time.process_time() - start) / rounds * 1e6


def per_message_ring(rounds: int, batch: int = 16) -> float:
    """CPU-µs of one message through a message ring (oceanus/ipc/msgring.py): the writer's put,
    the reader's read and typing, `batch` messages per read and one doorbell check per batch,
    no system call (the reader is awake)."""
    import tempfile

    from oceanus.ipc import budget, msgring
    from oceanus.ipc.aio import _new_tuple

    message, _ = _simple_messages()
    framed = frame(message)
    classes = m.KINDS.by_kind
    got: list[Any] = []

    def on_frame(data: Any) -> None:
        plain = marshal.loads(data)
        got.append(_new_tuple(classes[plain[-1]], plain))

    with tempfile.TemporaryDirectory(dir=budget.shm_dir()) as folder:
        path = f"{folder}/ring"
        msgring.create(path, msgring.DEFAULT_BYTES)
        writer, reader = msgring.MsgRingWriter(path), msgring.MsgRingReader(path)
        reader.disarm()
        start = time.process_time()
        for _ in range(rounds // batch):
            for _ in range(batch):
                writer.put(framed)
            writer.wants_doorbell()
            reader.read(on_frame, [])
            got.clear()
        elapsed = time.process_time() - start
        writer.close()
        reader.close()
    return elapsed / (rounds // batch * batch) * 1e6


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def per_wakeup(rounds: int, batch: int) -> tuple[float, float]:
    """(CPU-µs of the waking side, of the woken side) per round trip of `batch` messages."""
    ours, theirs = socket.socketpair()
    message = b"x" * 200 * batch  # `batch` framed requests of about a simple request's size
    pid = os.fork()
    if pid == 0:  # the reader: sleeps in poll, answers every write with one write
        ours.close()
        poll = select.poll()
        poll.register(theirs.fileno(), select.POLLIN)
        while True:
            poll.poll()
            data = theirs.recv(1 << 20)
            if not data:
                os._exit(0)
            theirs.sendall(data)
    theirs.close()
    poll = select.poll()
    poll.register(ours.fileno(), select.POLLIN)
    children_before = _children_cpu()
    start = time.process_time()
    for _ in range(rounds):
        ours.sendall(message)
        got = 0
        while got < len(message):
            poll.poll()
            got += len(ours.recv(1 << 20))
    own = time.process_time() - start
    ours.close()
    os.waitpid(pid, 0)
    child = _children_cpu() - children_before
    return own / rounds * 1e6, child / rounds * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20000)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(
        f"per message (core's codec for one simple request and its answer): "
        f"{per_message(args.rounds):.2f} CPU-us"
    )
    print(
        f"per message through a message ring (put, read, typed; 16 per read, reader awake): "
        f"{per_message_ring(args.rounds * 4):.2f} CPU-us"
    )
    for batch in (1, 16):
        writer, reader = per_wakeup(args.rounds // 4, batch)
        print(
            f"per wake-up, {batch:2d} messages per write: {writer + reader:.1f} CPU-us per round "
            f"trip (this side {writer:.1f}, the woken side {reader:.1f}); "
            f"{(writer + reader) / batch:.2f} per message"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
