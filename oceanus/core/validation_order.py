"""The order in which Triton walks a request's inputs: that of a libstdc++
`std::unordered_map<std::string, ...>` (Triton keeps them in one), which decides which of several
bad inputs its error names and how its "Got input(s) [...]" list is ordered.

libstdc++ hashes a string with MurmurHash64A (`std::_Hash_bytes`, seed 0xc70f6907), keeps one
singly linked list of nodes, puts a node whose bucket is empty at the front of that list and any
other node in front of its bucket's run, and when it grows re-inserts the nodes in list order by
the same rule (13 buckets up to 13 entries, then 29, 59, 127, ...).
Checked against g++ 12 and against the lists Triton 2.51 printed
(docs/triton-reference-behaviour.md, section 16; tests/core/test_validation_order.py).
"""

from __future__ import annotations

from collections.abc import Iterable

_MASK = (1 << 64) - 1
_MUL = (0xC6A4A793 << 32) + 0x5BD1E995
_SEED = 0xC70F6907
# libstdc++'s bucket counts as the table grows, as g++ 12 showed them (past 2357 entries the
# order is approximate: no model has that many inputs).
_BUCKETS = (13, 29, 59, 127, 257, 541, 1109, 2357)


def _shift_mix(value: int) -> int:
    return value ^ (value >> 47)


def string_hash(text: str) -> int:
    """`std::hash<std::string>` of `text`'s UTF-8 bytes on a 64-bit libstdc++."""
    data = text.encode()
    length = len(data)
    aligned = length & ~7
    value = (_SEED ^ (length * _MUL)) & _MASK
    for start in range(0, aligned, 8):
        word = int.from_bytes(data[start : start + 8], "little")
        value = ((value ^ ((_shift_mix((word * _MUL) & _MASK) * _MUL) & _MASK)) * _MUL) & _MASK
    if length & 7:
        value = ((value ^ int.from_bytes(data[aligned:], "little")) * _MUL) & _MASK
    return _shift_mix((_shift_mix(value) * _MUL) & _MASK)


def _insert(order: list[tuple[int, str]], item: tuple[int, str], buckets: int) -> None:
    bucket = item[0] % buckets
    for index, (code, _) in enumerate(order):
        if code % buckets == bucket:
            order.insert(index, item)  # in front of its bucket's run
            return
    order.insert(0, item)  # an empty bucket: the front of the list


def unordered_map_order(keys: Iterable[str]) -> list[str]:
    """The distinct `keys`, inserted in the order given, in the map's iteration order."""
    order: list[tuple[int, str]] = []
    seen: set[str] = set()
    level = 0
    for key in keys:
        if key in seen:
            continue
        seen.add(key)
        if len(order) + 1 > _BUCKETS[level] and level + 1 < len(_BUCKETS):
            level += 1
            rehashed: list[tuple[int, str]] = []
            for item in order:
                _insert(rehashed, item, _BUCKETS[level])
            order = rehashed
        _insert(order, (string_hash(key), key), _BUCKETS[level])
    return [key for _, key in order]
