"""Receive windows refilled as the application consumes (issue 42): a client streaming faster
than its handler reads is held by flow control, in process and on the wire."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.events
import hpack

from oceanus.frontends.grpc_transport import wire
from oceanus.frontends.grpc_transport.server import H2Server, Limits
from tests.frontends.grpc.http2_frames import REQUEST, frames_of, opened, raw_frame

WINDOW = wire.WINDOW


def test_padding_and_data_nobody_holds_are_given_back_at_once() -> None:
    conn, _ = opened()
    conn.receive(raw_frame(1, 0x4, 1, hpack.Encoder().encode(REQUEST)))
    # half a window of padding (and one byte of data): the padding is nobody's to hold
    padded = bytes((255,)) + b"x" + bytes(255)  # 256 bytes of padding
    for _ in range(WINDOW // 2 // 256 - 1):
        conn.receive(raw_frame(0, 0x8, 1, padded))
    assert conn.data_to_send() == b""
    conn.receive(raw_frame(0, 0x8, 1, padded))
    half = (WINDOW // 2).to_bytes(4, "big")
    assert frames_of(conn.data_to_send()) == [(8, 0, 0, half), (8, 0, 1, half)]
    # DATA on a stream we reset: given back to the connection, not to the stream
    conn.reset(1, wire.CANCEL)
    conn.data_to_send()
    for _ in range(WINDOW // 2 // wire.MAX_FRAME):
        conn.receive(raw_frame(0, 0, 1, bytes(wire.MAX_FRAME)))
    sent = frames_of(conn.data_to_send())
    assert [(kind, stream) for kind, _, stream, _ in sent] == [(8, 0)]


def test_a_stream_ended_by_the_client_gets_back_only_the_connections_window() -> None:
    conn, _ = opened()
    conn.receive(raw_frame(1, 0x4, 1, hpack.Encoder().encode(REQUEST)))
    for _ in range(WINDOW // wire.MAX_FRAME - 1):
        conn.receive(raw_frame(0, 0, 1, bytes(wire.MAX_FRAME)))
    conn.receive(raw_frame(0, 0x1, 1, bytes(wire.MAX_FRAME)))
    assert conn.data_to_send() == b""
    conn.consumed(1, WINDOW)
    sent = frames_of(conn.data_to_send())
    assert sent == [(8, 0, 0, WINDOW.to_bytes(4, "big"))]


# ---- on the wire: a raw h2 client streaming into a handler that reads when told -------------

MESSAGE = 16384 - 5  # a message with its 5-byte prefix fills a frame of the default size


async def _client_streams_into_a_slow_handler() -> None:
    gate = asyncio.Event()
    read: list[int] = []

    async def slow(requests: Any, context: Any) -> None:
        async for message in requests:
            read.append(len(message))
            await gate.wait()  # reads one message, then nothing until the gate opens

    limits = Limits(1 << 30, 7200, 20, False, 2, 300, 2)
    server = H2Server({b"/t.S/Slow": grpc.stream_stream_rpc_method_handler(slow)}, limits)
    port = await server.start("127.0.0.1", 0, False, None)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    peer = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    peer.initiate_connection()
    headers = [(":method", "POST"), (":scheme", "http"), (":path", "/t.S/Slow")]
    peer.send_headers(1, [*headers, (":authority", "x"), ("content-type", "application/grpc")])
    framed = b"\0" + MESSAGE.to_bytes(4, "big") + bytes(MESSAGE)
    total = 3 * WINDOW // len(framed) * len(framed)  # three windows' worth
    sent = 0

    events: list[Any] = []

    async def send_what_the_windows_allow() -> None:
        nonlocal sent
        while sent < total and peer.local_flow_control_window(1) >= len(framed):
            peer.send_data(1, framed)
            sent += len(framed)
        writer.write(peer.data_to_send())
        await writer.drain()

    async def pump() -> None:
        """The client's reader: takes in what the server sends, sends what it then may."""
        while data := await reader.read(65536):
            events.extend(peer.receive_data(data))
            await send_what_the_windows_allow()

    async def until(condition: Any) -> None:
        async with asyncio.timeout(30):
            while not condition():
                assert not any(isinstance(e, h2.events.StreamReset) for e in events)
                await asyncio.sleep(0.001)

    pumping = asyncio.create_task(pump())
    try:
        await send_what_the_windows_allow()
        # the server's 16 MiB windows arrive, the client sends until they are spent; the
        # handler has read one message
        await until(lambda: read and sent > 65535 and peer.local_flow_control_window(1) < 65535)
        assert 0 <= WINDOW - sent < len(framed)
        # a PING after all that DATA: any WINDOW_UPDATE for it comes before the PING's ACK
        peer.ping(b"12345678")
        await send_what_the_windows_allow()
        await until(lambda: any(isinstance(e, h2.events.PingAckReceived) for e in events))
        assert not any(isinstance(e, h2.events.WindowUpdated) and e.delta for e in events[3:])
        assert peer.local_flow_control_window(1) < len(framed)
        assert len(read) == 1
        buffered = sent - sum(n + 5 for n in read)  # held by the server, unread
        assert WINDOW - 2 * len(framed) < buffered <= WINDOW
        # the handler reads: the windows refill and the rest of the stream crosses
        gate.set()
        await until(lambda: sent == total)
        peer.end_stream(1)
        await send_what_the_windows_allow()
        await until(lambda: len(read) == total // len(framed))
    finally:
        pumping.cancel()
        writer.close()
        await server.stop(None)


def test_a_client_streaming_faster_than_its_handler_reads_is_held_by_the_window() -> None:
    asyncio.run(_client_streams_into_a_slow_handler())
