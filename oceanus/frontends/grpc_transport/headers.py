"""Header lists for the framing: HPACK both ways (the `hpack` library) with memories of
repeated blocks, and whether a request's header list is well formed (RFC 9113 8.2, 8.3).

The framing assembles header blocks from frames; what a block says is settled here.
"""

from __future__ import annotations

from typing import cast

import hpack

from oceanus.frontends.grpc_transport.call import percent_encode
from oceanus.frontends.grpc_transport.defences import MAX_HEADER_LIST

# Header values longer than this are not Huffman-coded (see HeaderCodec.encode).
HUFFMAN_MAX = 256

_PSEUDO = frozenset((b":method", b":scheme", b":path", b":authority"))
_REQUIRED = (b":method", b":scheme", b":path")
# RFC 9113 8.2.2: connection-specific fields are malformed in HTTP/2 (te: only "trailers").
_CONNECTION_SPECIFIC = frozenset(
    (b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade")
)


def _shown(key: bytes) -> str:
    return key[:100].decode("latin-1")


def check_request(headers: list[tuple[bytes, bytes]]) -> str | None:
    """Why a request's header list is malformed (RFC 9113 8.2, 8.3), in grpc core's words
    where it has them; None when it is well formed."""
    seen: set[bytes] = set()
    regular = False
    for key, value in headers:
        if key[:1] == b":":
            if key not in _PSEUDO:
                return f"Illegal header key: {_shown(key)}"
            if regular:
                return f"Pseudo-header '{_shown(key)}' after regular headers"
            if key in seen:
                return f"Duplicate '{_shown(key)}' header received"
            seen.add(key)
            if key == b":path" and not value:
                return "Empty ':path' header"
            continue
        regular = True
        if key != key.lower() or not key:
            return f"Illegal header key: {_shown(key)}"
        if key in _CONNECTION_SPECIFIC:
            return f"Connection-specific header '{_shown(key)}'"
        if key == b"te" and value != b"trailers":
            return "Error parsing 'te' metadata"
        if key == b"content-length" and not value.isdigit():
            return "Error parsing 'content-length' metadata"
    for key in _REQUIRED:
        if key not in seen:
            return f"Missing '{key.decode()}' header"
    return None


def refusal(text: str) -> list[tuple[bytes, bytes]]:
    """A malformed request's answer, as grpc core gives it: INTERNAL with `text` to read."""
    return [
        (b":status", b"200"),
        (b"content-type", b"application/grpc"),
        (b"grpc-status", b"13"),
        (b"grpc-message", percent_encode(text)),
    ]


class HeaderCodec:
    """One connection's HPACK state both ways. Decoding errors are hpack's (and IndexError,
    ValueError): the framing turns them into connection errors."""

    def __init__(self) -> None:
        self._decoder = hpack.Decoder(max_header_list_size=MAX_HEADER_LIST)
        self._encoder = hpack.Encoder()
        # The last header block decoded, when decoding it left the HPACK table as it was: a
        # client sending the same fully indexed headers every call is answered from here.
        self._decoded: tuple[bytes, list[tuple[bytes, bytes]]] | None = None
        self._checked: list[tuple[bytes, bytes]] | None = None  # the last list found well formed
        self.content_length = -1
        # Our constant header lists encoded, while the encoder's table has not changed.
        self._encoded: dict[int, tuple[list[tuple[bytes, bytes]], bytes]] = {}

    def set_table_size(self, size: int) -> None:
        """The peer's SETTINGS_HEADER_TABLE_SIZE: our encoded lists no longer hold."""
        self._encoder.header_table_size = size
        self._encoded.clear()

    def malformed(self, headers: list[tuple[bytes, bytes]]) -> str | None:
        """`check_request`, skipped for the list last found well formed; `content_length`
        is then the list's content-length (-1 without one)."""
        if headers is self._checked:
            return None
        malformed = check_request(headers)
        if malformed is None:
            self._checked = headers
            lengths = [int(value) for key, value in headers if key == b"content-length"]
            self.content_length = lengths[0] if len(set(lengths)) == 1 else -1
        return malformed

    def encode(self, headers: list[tuple[bytes, bytes]]) -> bytes:
        cached = self._encoded.get(id(headers))
        if cached is not None and cached[0] is headers:
            return cached[1]
        encoder = self._encoder
        table = encoder.header_table
        before = _table_state(table)
        resized = bool(encoder.table_size_changes)  # this block carries a size update
        # hpack's Huffman coder builds one integer of the whole string: quadratic in its length
        # (a 300 KB value took 22 s). Long values are sent as they are, which costs at most
        # a quarter more bytes and is linear.
        huffman = all(len(value) <= HUFFMAN_MAX for _, value in headers)
        block = encoder.encode(headers, huffman=huffman)
        if resized or _table_state(table) != before:
            self._encoded.clear()
        else:
            # Keeping the list keeps its id from being reused. Only our constant lists come
            # back (status trailers are new lists each time): a few slots, emptied when full.
            if len(self._encoded) >= 8:
                self._encoded.clear()
            self._encoded[id(headers)] = (headers, block)
        return block

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        decoded = self._decoded
        if decoded is not None and decoded[0] == block:
            return decoded[1]
        table = self._decoder.header_table
        before = _table_state(table)
        headers = cast(list[tuple[bytes, bytes]], self._decoder.decode(block, raw=True))
        self._decoded = (block, headers) if _table_state(table) == before else None
        return headers


def _table_state(table: hpack.table.HeaderTable) -> tuple[int, object, int]:
    """What changes when a header block changes an HPACK table (a new entry is a new tuple
    at the front; a size update changes the maximum)."""
    entries = table.dynamic_entries
    return (len(entries), entries[0] if entries else None, table.maxsize)
