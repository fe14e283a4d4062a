"""HTTP/2's vocabulary as RFC 9113 numbers it (frame types, flags, error codes, settings), the
frame header's layout, and the settings this server announces: what framing.py's state machine
and the connection speak in."""

from __future__ import annotations

import struct

from oceanus.frontends.grpc_transport import defences
from oceanus.frontends.grpc_transport.flow import WINDOW

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# Frame types
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS = 0, 1, 2, 3, 4
PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 5, 6, 7, 8, 9
# Flags
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
# Error codes
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL = 0x5, 0x6, 0x7, 0x8
COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x9, 0xB
# Settings
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = 0x4, 0x5, 0x6

MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW = 65535
# What we accept: RFC 9113's default, as grpc core announces; frames we send follow the peer's.
MAX_FRAME = 16384
HEAD = struct.Struct(">HBBBL")  # 24-bit length as 16 + 8 bits, type, flags, stream id
SETTING = struct.Struct(">HL")


def our_settings(max_streams: int) -> bytes:
    ours = {
        MAX_CONCURRENT_STREAMS: max_streams,
        INITIAL_WINDOW_SIZE: WINDOW,
        MAX_FRAME_SIZE: MAX_FRAME,
    }
    ours[MAX_HEADER_LIST_SIZE] = defences.MAX_HEADER_LIST
    return b"".join(SETTING.pack(key, value) for key, value in ours.items())


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    length = len(payload)
    return HEAD.pack(length >> 8, length & 0xFF, kind, flags, stream_id) + payload


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, increment.to_bytes(4, "big"))
