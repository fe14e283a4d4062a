"""The typed messages between the server and a stub, over a real socketpair."""

from __future__ import annotations

import socket
from typing import NamedTuple

import pytest

from oceanus.backends.python import messages as msg
from oceanus.backends.python import transport as tp
from oceanus.ipc.channel import MessageKinds

DESC = ("INPUT0", "FP32", (1, 16), 0, 64)
LOC = ("r", 0, 64)
EXAMPLES: list[tuple[object, ...]] = [
    msg.Init("/m/1/model.py", {"model_name": "m"}, False, "/s2w", "/w2s", 4096, "/spill-", 1024),
    msg.Autocomplete("/m/1/model.py", "{}"),
    msg.Exec(1, LOC, [(7, "id", "corr", 3, 0, "{}", ["OUT"], [DESC])]),
    msg.BlsResponse(2, None, msg.error_payload("INTERNAL", "no"), True),
    msg.QueryAnswer(3, True),
    msg.CallAnswer(4, None, {"value": 1.5}),
    msg.IsReady(5),
    msg.Finalize(),
    msg.Ready(None, True),
    msg.Result(6, LOC, [msg.ok_payload([DESC], '{"p": 1}'), None], None),
    msg.Response(7, None, None, True),
    msg.Log("INFO", "é"),
    msg.Bls(8, "other", -1, "", 0, 0, 0, "{}", [], True, LOC, [DESC]),
    msg.Query(9, 7),
    msg.Call(10, "load_model", ("m", "", {"file:1/model.py": b"\x00"})),
    msg.MetricUpdate(11, "observe", 0.25),
    msg.IsReadyAnswer(12, False, "boom"),
    msg.Finalized(),
]


def test_every_kind_arrives_as_itself() -> None:
    left, right = socket.socketpair()
    sender, receiver = tp.Channel(left), tp.Channel(right)
    assert {type(m) for m in EXAMPLES} == set(msg.KINDS.by_kind.values())
    for message in EXAMPLES:
        sender.send(message)
    for message in EXAMPLES:
        got = receiver.recv()
        assert type(got) is type(message)
        assert got == message
    sender.close()
    receiver.close()


def test_message_kinds_are_checked() -> None:
    class NoKind(NamedTuple):
        value: int

    class Taken(NamedTuple):
        value: int
        kind: int = msg.Log._field_defaults["kind"]

    with pytest.raises(TypeError, match="NoKind needs a last field"):
        MessageKinds([NoKind])
    with pytest.raises(ValueError, match="Taken and Log"):
        MessageKinds([msg.Log, Taken])
