"""Compressed request bodies and messages, inflated within a limit: one rule for every
frontend (HTTP's Content-Encoding, gRPC's grpc-encoding), each wording its own errors."""

from __future__ import annotations

import zlib

# A compressed body or message larger than this is inflated off the event loop: zlib inflates
# up to ~1000 times what it is given (1 MiB of gzip: a gigabyte of zeros, about a second).
INFLATE_INLINE_BYTES = 4096


def inflate_inline(size: int, encoding: bytes | None) -> bool:
    """Whether a body of `size` bytes in `encoding` may be inflated on the event loop."""
    return size <= INFLATE_INLINE_BYTES or not encoding or encoding.strip().lower() == b"identity"


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
