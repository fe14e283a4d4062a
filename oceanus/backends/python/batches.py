"""Batches on the wire, server side: what one Exec carries for a batch of requests, and where
the stub's answers go: a Result completes its batch, a Response goes to its request's stream
(decoupled models) or waits for its batch's result (a response sender's response).

Batches leave in one place (`exec_message`, sent by PythonInstance._send) and their answers
arrive in one place (`InFlight.on_result` / `on_response`), for whoever reworks the wake-ups
around them (issue 16).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from oceanus.backends.python import messages as msg
from oceanus.backends.python import transport as tp
from oceanus.backends.python.stub_launcher import Stub
from oceanus.core.backend import RequestJob, ResponseStream
from oceanus.core.errors import ErrorCode, InferenceServerError, internal
from oceanus.core.types import InferRequest

log = logging.getLogger("oceanus.backends.python")

Outputs = dict[str, np.ndarray]
# A request of an `Exec` before its inputs are placed: a RequestEntry without its descriptors.
RequestHead = tuple[int, str, int | str, int, int, str, list[str]]
# Request parameters Triton turns into request fields instead of passing them on to the model.
_RESERVED_PARAMETERS = frozenset(
    {
        "sequence_id",
        "sequence_start",
        "sequence_end",
        "priority",
        "timeout",
        "binary_data_output",
    }
)


class Batch:
    """A batch sent to the stub; `result` is set (under the mailbox's lock) when it is done:
    (outputs per request, parameters per request, output copy time in ns) or the error of the
    whole batch."""

    __slots__ = ("batch_id", "done", "jobs", "keys", "result")

    def __init__(self, jobs: Sequence[RequestJob], keys: list[int]) -> None:
        self.batch_id = 0  # set when sent (a resend after a stub's death gets a new one)
        self.jobs = jobs
        self.keys = keys
        self.done = False
        self.result: Any = None


def request_head(
    key: int, request: InferRequest, all_outputs: list[str], state_outputs: list[str]
) -> RequestHead:
    """One request of an `Exec`, but for its input descriptors (known once they are placed).
    Implicit state outputs are always asked for: the core carries them to the sequence's next
    request (Triton 2.51's Python backend drops them; docs/sequence-batching.md)."""
    names = all_outputs if request.outputs is None else [o.name for o in request.outputs]
    if state_outputs:
        names = names + state_outputs
    parameters = request.parameters
    if not parameters:
        return (key, request.id, 0, 0, 0, "{}", names)
    correlation = parameters.get("sequence_id", 0)
    if not isinstance(correlation, (int, str)):
        correlation = 0
    flags = (1 if parameters.get("sequence_start") else 0) | (
        2 if parameters.get("sequence_end") else 0
    )
    timeout = parameters.get("timeout", 0)
    if not isinstance(timeout, int):
        timeout = 0
    custom = {k: v for k, v in parameters.items() if k not in _RESERVED_PARAMETERS}
    # Compact, as Triton's request.parameters() text is.
    compact = json.dumps(custom, separators=(",", ":"))
    return (key, request.id, correlation, flags, timeout, compact, names)


def exec_message(
    batch_id: int,
    heads: list[RequestHead],
    loc: msg.Location,
    descs: list[list[tp.TensorDesc]],
) -> msg.Exec:
    """The Exec of a batch whose inputs were placed at `loc` (one descriptor list each)."""
    return msg.Exec(batch_id, loc, [(*h, d) for h, d in zip(heads, descs, strict=True)])


def payload_outputs(
    block: np.ndarray | None, payload: msg.Payload
) -> Outputs | InferenceServerError:
    if msg.is_error(payload):
        return InferenceServerError(ErrorCode[payload[1]], payload[2])
    return {name: array for name, _, array in tp.unpack(block, payload[1], copy=True)}


def payload_parameters(payload: msg.Payload | None) -> dict[str, Any] | None:
    """The response parameters a model set (None when it set none)."""
    if payload is None or msg.is_error(payload) or not payload[2] or payload[2] == "{}":
        return None
    parameters = json.loads(payload[2])
    return parameters if isinstance(parameters, dict) and parameters else None


class InFlight:
    """What one instance's stub is executing: batches by id until their result, requests by
    key while their batch runs, decoupled streams until their final response, and responses
    sent through a response sender until their batch's result. Guarded by the instance's lock
    (`lock`), except where said."""

    def __init__(self, name: str, decoupled: bool, lock: threading.Lock) -> None:
        self.name = name
        self.decoupled = decoupled
        self.lock = lock
        self.batches: dict[int, Batch] = {}
        # key -> job, while its batch executes (decoupled: until its final response, since a
        # model that answers from its own thread asks `is_cancelled()` after execute returned)
        self.jobs: dict[int, RequestJob] = {}
        self.streams: dict[int, ResponseStream | None] = {}  # key -> its stream (decoupled)
        # key -> (outputs or error, parameters): a non-decoupled model's response sent through
        # its response sender, until the batch's result comes (read and written by the one
        # thread that reads the channel at a time).
        self.stash: dict[int, tuple[Outputs | InferenceServerError, dict[str, Any] | None]] = {}

    def add(self, batch_id: int, batch: Batch) -> None:
        """A batch about to be sent (the caller holds the lock)."""
        self.batches[batch_id] = batch
        for key, job in zip(batch.keys, batch.jobs, strict=True):
            self.jobs[key] = job
            if self.decoupled:
                self.streams[key] = job.stream

    def drop(self, batch_id: int) -> None:
        with self.lock:
            self.batches.pop(batch_id, None)

    def finished(self, batch: Batch) -> None:
        """The batch's execution ended: cancellation queries about its requests are late
        (except for decoupled requests whose final response has not come yet)."""
        for key in batch.keys:
            if key not in self.streams:
                self.jobs.pop(key, None)

    def forget_streams(self, batch: Batch) -> None:
        """The batch failed as a whole: its requests' streams are the core's to end."""
        if self.decoupled:
            with self.lock:
                for key in batch.keys:
                    self.streams.pop(key, None)
                    self.jobs.pop(key, None)

    def take_all(self) -> tuple[list[Batch], list[ResponseStream | None]]:
        """Everything in flight, for a stub that is gone (the caller holds the lock)."""
        batches, self.batches = list(self.batches.values()), {}
        streams, self.streams = list(self.streams.values()), {}
        self.stash.clear()
        return batches, streams

    def cancelled(self, key: int) -> bool:
        job = self.jobs.get(key)
        return job is not None and job.cancelled()

    def on_result(self, stub: Stub, message: msg.Result) -> None:
        """A batch's result (under the mailbox's lock): the batch's waiter takes it from
        there."""
        started = time.monotonic_ns()
        with self.lock:
            batch = self.batches.pop(message.batch_id, None)
        if message.error is not None or message.payloads is None:
            log.error("%s", message.error)
            error = internal(message.error or "no result")
            if batch is not None:
                batch.result = error
                batch.done = True
            return
        loc = message.location
        block, token = stub.reader.open(loc) if loc is not None else (None, None)
        try:
            if batch is None:  # timed out meanwhile
                return
            outputs: list[Outputs | InferenceServerError] = []
            parameters: list[dict[str, Any] | None] = []
            for key, payload in zip(batch.keys, message.payloads, strict=True):
                if payload is not None:
                    outputs.append(payload_outputs(block, payload))
                    parameters.append(payload_parameters(payload))
                elif self.decoupled:
                    outputs.append({})
                    parameters.append(None)
                else:
                    stashed = self.stash.pop(key, None) or (
                        internal(f"model instance '{self.name}' sent no response for a request"),
                        None,
                    )
                    outputs.append(stashed[0])
                    parameters.append(stashed[1])
        finally:
            stub.reader.release(token)
        batch.result = (outputs, parameters, time.monotonic_ns() - started)
        batch.done = True

    def on_response(self, stub: Stub, message: msg.Response) -> None:
        """A response sent through a response sender."""
        payload, loc = message.payload, message.location
        block, token = stub.reader.open(loc) if loc is not None else (None, None)
        try:
            result = payload_outputs(block, payload) if payload is not None else None
        finally:
            stub.reader.release(token)
        parameters = payload_parameters(payload)
        key = message.key
        if not self.decoupled:
            if result is not None:
                self.stash[key] = (result, parameters)
            return
        stream = self.streams.get(key)
        if message.final:
            self.streams.pop(key, None)
            self.jobs.pop(key, None)
        if stream is None:
            return
        if isinstance(result, InferenceServerError):
            stream.send(None, result, message.final)
        else:
            stream.send(result, None, message.final, parameters)
