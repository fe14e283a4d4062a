"""The server's side of a stub's messages: which part of the backend each kind goes to.

Called by whichever thread reads the stub's channel (mailbox), under the mailbox's lock, and
while a stub starts, for what its initialize() sends (log lines, metrics, model control)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from oceanus.backends.python import messages as msg
from oceanus.backends.python.batches import InFlight
from oceanus.backends.python.server_calls import ServerCalls, on_metric
from oceanus.backends.python.stub_launcher import Stub

model_log = logging.getLogger("oceanus.backends.python.model")
_MODEL_LOG_LEVELS = {
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "VERBOSE": logging.DEBUG,
}

Handler = Callable[[Stub, Any], None]


def log_line(message: msg.Log) -> None:
    """A pb_utils.Logger line, to the server's log."""
    model_log.log(_MODEL_LOG_LEVELS.get(message.level, logging.INFO), "%s", message.text)


class Dispatcher:
    """Sends each message of an instance's stubs to the part that handles it."""

    def __init__(
        self,
        inflight: InFlight,
        calls: ServerCalls,
        on_is_ready: Callable[[Stub, msg.IsReadyAnswer], None],
    ) -> None:
        self._inflight = inflight
        self._handlers: dict[type, Handler] = {
            msg.Result: inflight.on_result,
            msg.Response: inflight.on_response,
            msg.Log: lambda s, m: log_line(m),
            msg.Bls: calls.on_bls,
            msg.Query: self._on_query,
            msg.MetricUpdate: lambda s, m: on_metric(s.metrics, m),
            msg.Call: lambda s, m: calls.on_call(s.channel, s.metrics, m),
            msg.IsReadyAnswer: on_is_ready,
            msg.Finalized: _on_finalized,
        }

    def __call__(self, stub: Stub, message: tuple[Any, ...]) -> None:
        handler = self._handlers.get(type(message))
        if handler is not None:  # anything else is out of turn (a late Ready): ignored
            handler(stub, message)

    def _on_query(self, stub: Stub, message: msg.Query) -> None:
        answer = self._inflight.cancelled(message.key)
        with contextlib.suppress(OSError):
            stub.channel.send(msg.QueryAnswer(message.query_id, answer))


def _on_finalized(stub: Stub, message: msg.Finalized) -> None:
    stub.finalized = True
