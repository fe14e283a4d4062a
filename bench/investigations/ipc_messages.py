"""What typing the Python backend's messages costs: tagged tuples against NamedTuples.

Three encodings of the same messages, each timed for one message's whole way through the
codec: build it, marshal it, frame it, unframe it, unmarshal it, dispatch it to its handler
(which reads one field):

- `tuple`      the tuples tagged with a letter that the Python backend sent before issue 15,
               dispatched by the if-chains the server and the stub used (`kind == "r"`, ...)
- `prefix`     NamedTuples sent as `(kind number, *fields)`, rebuilt with `_make(data[1:])`
- `kind last`  NamedTuples whose last field is the kind (oceanus.ipc.channel.MessageKinds, what
               the Python backend uses now): sent as `message[:]`, rebuilt with one
               `tuple.__new__`, dispatched through a dict by type

Then one socketpair, one thread (send 64, receive 64, repeated): the Channel as it was before
issue 15 (tagged tuples, the frame copied twice on receipt), and the real
`oceanus.ipc.channel.Channel` carrying the same messages as plain tuples and as typed messages.

    python bench/investigations/ipc_messages.py [--number 2000] [--repeat 40]

Prints a table of nanoseconds per message (the best of the repeats: this measures code, not
the machine's noise) and writes bench/results/ipc-messages-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import marshal
import operator
import socket
import struct
import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: benchlib
import benchlib

from oceanus.backends.python import messages as msg
from oceanus.ipc.channel import Channel

_LENGTH = struct.Struct("<I")
LOC = ("r", 4096, 8192)
DESC = ("INPUT0", "FP32", (1, 16), 0, 64)


def entry(key: int) -> tuple[Any, ...]:
    return (key, "", 0, 0, 0, "{}", ["OUTPUT0"], [DESC])


def ok(n: int) -> list[Any]:
    return [("ok", [("OUTPUT0", "FP32", (1, 16), 64 * i, 64)], "{}") for i in range(n)]


# (label, typed message, the tag letter the message had before issue 15)
SAMPLES: list[tuple[str, tuple[Any, ...], str]] = [
    ("Exec, 1 request", msg.Exec(17, LOC, [entry(1)]), "x"),
    ("Exec, 16 requests", msg.Exec(17, LOC, [entry(k) for k in range(16)]), "x"),
    ("Result, 1 response", msg.Result(17, LOC, ok(1), None), "r"),
    ("Result, 16 responses", msg.Result(17, LOC, ok(16), None), "r"),
    ("Response (decoupled)", msg.Response(5, LOC, ok(1)[0], False), "d"),
    ("Log", msg.Log("INFO", "a line a model wrote with pb_utils.Logger"), "l"),
    ("Query", msg.Query(3, 5), "q"),
    ("QueryAnswer", msg.QueryAnswer(3, False), "Q"),
    ("MetricUpdate", msg.MetricUpdate(2, "increment", 1.0), "m"),
]
# The old dispatch order: the server's `_dispatch`, then the stub's `_on_message` and its
# main loop (EXEC went through the stub's inbox: four comparisons, then one more).
SERVER_CHAIN = ("r", "d", "l", "b", "q", "m", "c", "I", "F")
STUB_CHAIN = ("B", "Q", "C", "i", "x")


def _builder(make: str, count: int, namespace: dict[str, Any]) -> Callable[..., Any]:
    """A function that builds a message from its fields as a sender writes it: `make` applied
    to named locals (a tuple literal, or a call of the NamedTuple)."""
    names = ", ".join(f"f{i}" for i in range(count))
    source = f"def build({names}):\n    return {make.format(fields=names)}\n"
    exec(source, namespace)
    built: Callable[..., Any] = namespace["build"]
    return built


def tuple_codec(message: tuple[Any, ...], tag: str) -> Callable[[], Any]:
    fields = tuple(message[:-1])
    build = _builder(f"({tag!r}, {{fields}})", len(fields), {})
    chain = SERVER_CHAIN if tag in SERVER_CHAIN else STUB_CHAIN
    handlers = {kind: operator.itemgetter(1) for kind in chain}
    dumps, loads, length = marshal.dumps, marshal.loads, _LENGTH

    def run() -> Any:
        data = dumps(build(*fields))
        frame = length.pack(len(data)) + data
        got = loads(bytes(frame[4:]))
        kind = got[0]
        for name in chain:  # if kind == A: ... elif kind == B: ...
            if kind == name:
                return handlers[name](got)
        return None

    return run


def prefix_codec(message: tuple[Any, ...]) -> Callable[[], Any]:
    names = message._fields[:-1]  # type: ignore[attr-defined]
    cls = NamedTuple(type(message).__name__, [(n, Any) for n in names])  # type: ignore[misc]
    kinds = {cls: 1}
    types = [None, cls]
    fields = tuple(message[:-1])
    handlers = {cls: operator.attrgetter(names[0])}
    build = _builder("cls({fields})", len(fields), {"cls": cls})
    dumps, loads, length = marshal.dumps, marshal.loads, _LENGTH

    def run() -> Any:
        built = build(*fields)
        data = dumps((kinds[type(built)], *built))
        frame = length.pack(len(data)) + data
        plain = loads(bytes(frame[4:]))
        got = types[plain[0]]._make(plain[1:])
        return handlers[type(got)](got)

    return run


def kind_last_codec(message: tuple[Any, ...]) -> Callable[[], Any]:
    cls = type(message)
    fields = tuple(message[:-1])
    classes = msg.KINDS.by_kind
    handlers = {cls: operator.attrgetter(message._fields[0])}  # type: ignore[attr-defined]
    build = _builder("cls({fields})", len(fields), {"cls": cls})
    dumps, loads, length, new = marshal.dumps, marshal.loads, _LENGTH, tuple.__new__

    def run() -> Any:
        built = build(*fields)
        data = dumps(built[:])
        frame = length.pack(len(data)) + data
        plain = loads(bytes(frame[4:]))
        got = new(classes[plain[-1]], plain)
        return handlers[type(got)](got)

    return run


def best_ns(runs: list[Callable[[], Any]], number: int, repeat: int) -> list[float]:
    """The best time of each run, interleaved so that the machine's noise hits them alike."""
    best = [float("inf")] * len(runs)
    for _ in range(repeat):
        for index, run in enumerate(runs):
            best[index] = min(best[index], timeit.timeit(run, number=number) / number * 1e9)
    return best


class BeforeChannel(Channel):
    """The channel's receiving side before issue 15: the frame copied out twice."""

    def recv(self, timeout: float | None = None, wakeable: bool = False) -> Any:
        buffer = self._buffer
        while True:
            if len(buffer) >= 4:
                (length,) = _LENGTH.unpack_from(buffer, 0)
                if len(buffer) >= 4 + length:
                    data = bytes(buffer[4 : 4 + length])
                    del buffer[: 4 + length]
                    return marshal.loads(data)
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise EOFError("channel closed")
            buffer += chunk


def channel_ns(message: tuple[Any, ...], tag: str, number: int, repeat: int) -> list[float]:
    """Per message, sending 64 and receiving them on one socketpair: before issue 15, plain
    tuples now, typed now (the best round of each, interleaved)."""
    cls, fields = type(message), tuple(message[:-1])
    plain = (tag, *fields)
    rounds = max(1, number // 64)
    best = [float("inf")] * 3
    ends = []
    for kind, kinds in ((BeforeChannel, None), (Channel, None), (Channel, msg.KINDS)):
        left, right = socket.socketpair()
        ends.append((kind(left, kinds), kind(right, kinds)))
    for _ in range(repeat):
        for index, (sender, receiver) in enumerate(ends):
            typed = index == 2
            started = time.perf_counter_ns()
            for _ in range(rounds):
                for _ in range(64):
                    sender.send(cls(*fields) if typed else plain)
                for _ in range(64):
                    receiver.recv()
            elapsed = (time.perf_counter_ns() - started) / (rounds * 64)
            best[index] = min(best[index], elapsed)
    for sender, receiver in ends:
        sender.close()
        receiver.close()
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=40)
    args = parser.parse_args()
    load_before = benchlib.loadavg()
    rows, results = [], []
    for label, message, tag in SAMPLES:
        old, prefix, last = best_ns(
            [tuple_codec(message, tag), prefix_codec(message), kind_last_codec(message)],
            args.number,
            args.repeat,
        )
        size = len(marshal.dumps(message[:]))
        rows.append(
            [label, size, f"{old:.0f}", f"{prefix:.0f}", f"{last:.0f}", f"{last / old:.2f}x"]
        )
        results.append(
            {
                "message": label,
                "bytes": size,
                "tuple_ns": old,
                "prefix_ns": prefix,
                "kind_last_ns": last,
            }
        )
    print("codec: build, marshal, frame, unframe, unmarshal, dispatch (ns per message, best)")
    print(
        benchlib.table(
            ["message", "bytes", "tuple", "prefix", "kind last", "kind last / tuple"], rows
        )
    )
    print()
    socket_rows = []
    for label, message, tag in SAMPLES[:4]:
        before, plain, typed = channel_ns(message, tag, args.number, args.repeat)
        socket_rows.append(
            [label, f"{before:.0f}", f"{plain:.0f}", f"{typed:.0f}", f"{typed / before:.2f}x"]
        )
        results.append(
            {
                "message": label,
                "channel_before_ns": before,
                "channel_tuple_ns": plain,
                "channel_typed_ns": typed,
            }
        )
    print("over a socketpair, one thread (ns per message sent and received, best)")
    headers = ["message", "before", "tuples now", "typed now", "typed now / before"]
    print(benchlib.table(headers, socket_rows))
    print(f"load before {load_before}, after {benchlib.loadavg()}")
    out_dir = benchlib.RESULTS_DIR
    out_dir.mkdir(exist_ok=True)
    out = out_dir / f"ipc-messages-{time.strftime('%Y%m%d-%H%M%S')}.json"
    document = {"number": args.number, "repeat": args.repeat, "loadavg_before": load_before}
    out.write_text(json.dumps({**document, "results": results}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
