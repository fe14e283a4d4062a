"""Compressed request bodies and messages, inflated within a limit: one rule for every
frontend (HTTP's Content-Encoding, gRPC's grpc-encoding), each wording its own errors."""

from __future__ import annotations

import zlib


def inflate(data: bytes, encoding: bytes, limit: int) -> bytes | None:
    """`data` inflated from gzip or deflate (zlib) to at most `limit` + 1 bytes, so that a
    result longer than `limit` means too large and a bomb is never inflated whole; None for an
    encoding this does not know. Raises zlib.error for data that is not what it says."""
    if encoding in (b"gzip", b"x-gzip"):
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    elif encoding == b"deflate":
        inflater = zlib.decompressobj()
    else:
        return None
    return inflater.decompress(data, limit + 1)
