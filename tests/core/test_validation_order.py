"""Triton lists and checks a request's inputs in libstdc++'s unordered_map order
(oceanus/core/validation_order.py); the expected orders were printed by Triton 2.51 itself and, for
the larger maps, by a std::unordered_map<std::string, int> built with g++ 12."""

from __future__ import annotations

import pytest

from oceanus.core.validation_order import string_hash, unordered_map_order

INPUT_40 = (
    "input_39 input_38 input_37 input_33 input_31 input_30 input_12 input_35 input_28 input_11 "
    "input_14 input_19 input_36 input_24 input_6 input_3 input_5 input_20 input_8 input_32 "
    "input_15 input_9 input_2 input_27 input_13 input_16 input_34 input_1 input_4 input_7 "
    "input_10 input_0 input_25 input_21 input_17 input_29 input_22 input_18 input_23 input_26"
)


@pytest.mark.parametrize(
    ("inserted", "iterated"),
    [
        # from Triton 2.51's "Got input(s) [...]" lists
        ("INPUT0 INPUT1 INPUTX", "INPUTX INPUT1 INPUT0"),
        ("INPUT0 INPUT1 INPUTX INPUTY", "INPUTY INPUTX INPUT1 INPUT0"),
        ("INPUTA INPUT0 INPUTB", "INPUTB INPUT0 INPUTA"),
        ("a b c d e", "e c b d a"),
        # from g++ 12: UTF-8 names, the first growth (14 entries: 29 buckets), and 40 entries
        ("é_input ünïcode x", "x ünïcode é_input"),
        (
            " ".join(f"in{i}" for i in range(14)),
            "in1 in13 in2 in3 in8 in5 in0 in6 in7 in4 in10 in9 in11 in12",
        ),
        (" ".join(f"input_{i}" for i in range(40)), INPUT_40),
    ],
)
def test_order_matches_libstdcxx(inserted: str, iterated: str) -> None:
    assert unordered_map_order(inserted.split()) == iterated.split()


def test_repeated_keys_keep_their_first_place() -> None:
    assert unordered_map_order(["a", "b", "a"]) == unordered_map_order(["a", "b"])


def test_hash_is_murmur64a_with_libstdcxx_seed() -> None:
    # std::hash<std::string>{}("") and ("a") on x86-64 libstdc++
    assert string_hash("") == 6142509188972423790
    assert string_hash("a") == 4993892634952068459
