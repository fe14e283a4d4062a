"""The shared-memory rings and the control channel, in one process."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import numpy as np
import pytest

from oceanus.backends.python import messages as msg
from oceanus.backends.python import transport as tp


@pytest.fixture
def ring(tmp_path: Path) -> tuple[tp.RingWriter, tp.RingReader, Path]:
    path = tmp_path / "ring"
    tp.create_ring_file(str(path), 4096)
    return (
        tp.RingWriter(str(path), 4096, str(tmp_path / "spill-")),
        tp.RingReader(str(path), 4096),
        tmp_path,
    )


def round_trip(
    writer: tp.RingWriter, reader: tp.RingReader, items: list[tp.TensorItem], copy: bool = True
) -> tuple[list[tp.TensorItem], tp.Location | None]:
    loc, descs = tp.pack(writer, [items])
    block, token = reader.open(loc) if loc is not None else (None, None)
    arrays = tp.unpack(block, descs[0], copy=copy)
    reader.release(token)
    return arrays, loc


def test_every_datatype_round_trips(ring: tuple[tp.RingWriter, tp.RingReader, Path]) -> None:
    writer, reader, _ = ring
    items: list[tp.TensorItem] = [
        ("b", "BOOL", np.array([True, False])),
        ("u8", "UINT8", np.arange(5, dtype=np.uint8)),
        ("i64", "INT64", np.array([[2**62, -1]], dtype=np.int64)),
        ("f16", "FP16", np.array([0.5], dtype=np.float16)),
        ("f64", "FP64", np.arange(6, dtype=np.float64).reshape(2, 3)[:, ::2]),  # not contiguous
        ("s", "BYTES", np.array([[b"a", b""], [b"\x00\xff", "é".encode()]], dtype=object)),
        ("empty", "FP32", np.zeros((0, 3), dtype=np.float32)),
    ]
    arrays, loc = round_trip(writer, reader, items)
    assert loc is not None and loc[0] == "r"
    for (name, datatype, sent), (got_name, got_type, got) in zip(items, arrays, strict=True):
        assert (name, datatype) == (got_name, got_type)
        assert got.shape == sent.shape
        assert got.tolist() == sent.tolist()


def test_ring_wraps_and_reuses_space(ring: tuple[tp.RingWriter, tp.RingReader, Path]) -> None:
    writer, reader, tmp = ring
    for i in range(200):  # far more than 4 KiB in total
        array = np.full(100 + i % 7, i, dtype=np.int32)
        arrays, loc = round_trip(writer, reader, [("x", "INT32", array)])
        assert loc is not None and loc[0] == "r"
        assert arrays[0][2].tolist() == array.tolist()
    assert not list(tmp.glob("spill-*"))


def test_unreleased_block_is_never_overwritten(
    ring: tuple[tp.RingWriter, tp.RingReader, Path],
) -> None:
    writer, reader, tmp = ring
    held = np.arange(256, dtype=np.int32)  # 1 KiB, kept as a view
    loc, descs = tp.pack(writer, [[("held", "INT32", held)]])
    assert loc is not None
    block, held_token = reader.open(loc)
    view = tp.unpack(block, descs[0], copy=False)[0][2]
    for i in range(20):  # later blocks come and go; some must spill around the held one
        arrays, _ = round_trip(writer, reader, [("x", "INT32", np.full(200, i, dtype=np.int32))])
        assert arrays[0][2].tolist() == [i] * 200
        assert view.tolist() == held.tolist()
    reader.release(held_token)
    assert not list(tmp.glob("spill-*"))  # spilled files are unlinked by the reader


def test_large_message_spills_to_a_one_off_file(
    ring: tuple[tp.RingWriter, tp.RingReader, Path],
) -> None:
    writer, reader, tmp = ring
    big = np.arange(10_000, dtype=np.float64)
    arrays, loc = round_trip(writer, reader, [("big", "FP64", big)])
    assert loc is not None and loc[0] == "f"
    assert arrays[0][2].tolist() == big.tolist()
    assert not list(tmp.glob("spill-*"))


def test_channel_frames_messages_across_threads() -> None:
    left, right = socket.socketpair()
    sender, receiver = tp.Channel(left), tp.Channel(right)
    messages = [msg.Call(i, "x" * (i * 97 % 5000), [1, 2.5, None, b"\x00"]) for i in range(300)]

    def send_all(part: list[msg.Call]) -> None:
        for message in part:
            sender.send(message)

    threads = [threading.Thread(target=send_all, args=(messages[i::3],)) for i in range(3)]
    for thread in threads:
        thread.start()
    got = [receiver.recv() for _ in messages]
    for thread in threads:
        thread.join()
    assert all(isinstance(message, msg.Call) for message in got)
    assert sorted(got, key=lambda m: m.call_id) == messages  # type: ignore[union-attr]
    sender.close()
    with pytest.raises(EOFError):
        receiver.recv()
    receiver.close()


def test_held_messages_leave_in_order_before_anything_else_and_before_a_wait(
    ring: tuple[tp.RingWriter, tp.RingReader, Path],
) -> None:
    """A held message (a group's batches sent ahead) crosses with the next message sent, at
    flush(), or before its sender blocks waiting for the other end: never later."""
    writer, reader, _ = ring
    left, right = socket.socketpair()
    sender, receiver = tp.Channel(left), tp.Channel(right)

    def hold(value: int) -> None:
        items: list[tp.TensorItem] = [("x", "INT32", np.full(4, value, dtype=np.int32))]
        sender.send_tensors(writer, [items], lambda loc, d: msg.Exec(value, loc, d), hold=True)

    def received() -> list[int | str]:
        got: list[int | str] = []
        while (message := receiver.recv(timeout=0.05)) is not None:
            if not isinstance(message, msg.Exec):
                got.append(type(message).__name__)
                continue
            block, token = reader.open(message.location)
            array = tp.unpack(block, message.requests[0], copy=True)[0][2]
            reader.release(token)
            assert array.tolist() == [message.batch_id] * 4  # its own ring block
            got.append(message.batch_id)
        return got

    hold(1)
    hold(2)
    assert received() == []  # held: nothing crossed yet
    sender.send(msg.Finalize())  # the next message sent takes them along, first
    assert received() == [1, 2, "Finalize"]
    hold(3)
    sender.flush()
    assert received() == [3]
    hold(4)
    assert sender.recv(timeout=0.01) is None  # it waited for the other end: 4 went first
    assert received() == [4]
    sender.close()
    receiver.close()


def test_numpy_dtypes() -> None:
    assert tp.numpy_dtype("FP32") == np.dtype(np.float32)
    assert tp.numpy_dtype("BYTES") == np.dtype(object)
    assert tp.numpy_dtype("BF16").itemsize == 2
    with pytest.raises(ValueError):
        tp.numpy_dtype("FP8")
    assert os.path.isdir(tp.shm_dir())


def test_a_growing_ring_moves_to_a_larger_segment_old_blocks_stay_readable(tmp_path: Path) -> None:
    path = tmp_path / "ring"
    tp.create_ring_file(str(path), 4096)
    grown: list[tuple[str, int]] = []
    writer = tp.RingWriter(
        str(path), 4096, str(tmp_path / "spill-"), 4096, lambda c: grown.append(("w", c))
    )
    reader = tp.RingReader(str(path), 4096, lambda c: grown.append(("r", c)))
    os.unlink(path)
    small = np.arange(256, dtype=np.int32)  # 1 KiB: fits the first segment
    loc, descs = tp.pack(writer, [[("small", "INT32", small)]])
    assert loc is not None and loc[0] == "r"
    block, held = reader.open(loc)
    kept = tp.unpack(block, descs[0], copy=False)[0][2]  # a view into the first segment
    big = np.arange(3000, dtype=np.float32)  # 12,000 B: the ring grows by 2 steps of 4 KiB
    arrays, loc = round_trip(writer, reader, [("big", "FP32", big)])
    assert loc is not None and loc[0] == "g" and loc[2] == 12288
    assert arrays[0][2].tolist() == big.tolist()
    assert grown == [("w", 12288), ("r", 12288)]
    assert writer.capacity == reader.capacity == 12288
    # The new segment's name is gone once the reader mapped it; nothing was spilled.
    assert not list(tmp_path.glob("spill-*"))
    # The old segment's block is still readable, and later blocks wrap in the new segment.
    assert kept.tolist() == small.tolist()
    reader.release(held)
    for i in range(40):
        arrays, loc = round_trip(writer, reader, [("x", "INT32", np.full(900, i, np.int32))])
        assert loc is not None and loc[0] == "r"
        assert arrays[0][2].tolist() == [i] * 900
    assert kept.tolist() == small.tolist()
    # A full ring (its blocks held) grows by one step.
    tokens = []
    for i in range(5):
        loc, descs = tp.pack(writer, [[("x", "INT32", np.full(900, i, np.int32))]])
        tokens.append(reader.open(loc)[1])
    assert writer.capacity == 16384
    for token in tokens:
        reader.release(token)


def test_a_ring_without_growth_keeps_its_size(
    ring: tuple[tp.RingWriter, tp.RingReader, Path],
) -> None:
    writer, reader, _ = ring
    _, loc = round_trip(writer, reader, [("big", "FP64", np.zeros(1000))])
    assert loc is not None and loc[0] == "f" and writer.capacity == 4096


def test_a_grown_ring_shrinks_back_once_a_window_passes_without_needing_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ring"
    tp.create_ring_file(str(path), 4096)
    sizes: list[int] = []
    # A window of 0 s: every message ends one (the server's is rings.SHRINK_AFTER_S).
    writer = tp.RingWriter(str(path), 4096, str(tmp_path / "spill-"), 4096, sizes.append, 0.0)
    reader = tp.RingReader(str(path), 4096)
    os.unlink(path)
    big = np.arange(3000, dtype=np.float32)
    _, loc = round_trip(writer, reader, [("big", "FP32", big)])
    assert loc is not None and loc[0] == "g" and writer.capacity == 12288
    small = np.arange(256, dtype=np.int32)
    # The window that saw the big block keeps the size; the next, with small blocks only, ends
    # in a move back to the size at start.
    arrays, loc = round_trip(writer, reader, [("small", "INT32", small)])
    assert loc is not None and loc[0] == "r" and writer.capacity == 12288
    arrays, loc = round_trip(writer, reader, [("small", "INT32", small)])
    assert loc is not None and loc[0] == "g" and loc[2] == 4096
    assert arrays[0][2].tolist() == small.tolist()
    assert writer.capacity == reader.capacity == 4096 and sizes == [12288, 4096]
    for i in range(20):  # and it serves on, growing again when it must
        data = np.full(900 if i % 5 else 2500, i, np.int32)
        arrays, _ = round_trip(writer, reader, [("x", "INT32", data)])
        assert arrays[0][2].tolist() == data.tolist()
    assert not list(tmp_path.glob("spill-*"))
