"""A Python model's stub process (Triton's word for it): starting one, and what belongs to it.

`spawn` starts `python -m oceanus.backends.python.pb_stub`, creates the two shared-memory rings
(each may grow and shrink later; the Stub keeps what they hold counted in the budget), sends
Init and waits for Ready (initialize() returned), serving the log lines, metric and
model-control calls the model makes from initialize() meanwhile. `run_autocomplete` starts a
short-lived one that only calls the model's auto_complete_config.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oceanus.backends.python import messages as msg
from oceanus.backends.python import transport as tp
from oceanus.core.errors import InferenceServerError, internal, unavailable
from oceanus.core.observability.custom_metrics import MetricOwner
from oceanus.ipc import budget

if TYPE_CHECKING:
    from oceanus.backends.python.exec_env import PythonEnv

log = logging.getLogger("oceanus.backends.python")

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[3])
# A model's is_ready(): an answer younger than this is reused (instance.py asks).
IS_READY_CACHE_S = 0.5


class Stub:
    """One incarnation of the stub process and what belongs to it."""

    def __init__(
        self,
        generation: int,
        process: subprocess.Popen[bytes],
        channel: tp.Channel,
        writer: tp.RingWriter,
        reader: tp.RingReader,
        prefix: str,
        metrics: MetricOwner,
        has_is_ready: bool,
    ) -> None:
        self.generation = generation
        self.process = process
        self.channel = channel
        self.writer = writer
        self.reader = reader
        self.prefix = prefix  # of its shared-memory files
        self.metrics = metrics  # the custom metrics this stub created
        self.finalized = False
        self.mailbox: tp.Mailbox | None = None
        self.threads: list[Any] = []
        # The model's is_ready(), when it has one: the last answer, when it came, the check
        # in flight (id, sent at).
        self.has_is_ready = has_is_ready
        self.user_ready = True
        self.checked_at = -IS_READY_CACHE_S
        self.check_id: int | None = None
        self.check_sent = 0.0

    def held(self) -> int:
        """What its rings hold in /dev/shm now (their newest segments)."""
        return 2 * tp.RING_HEADER + self.writer.capacity + self.reader.capacity

    def rings_resized(self, name: str) -> None:
        """One of the rings moved to a segment of another size (its writer grew or shrank it:
        oceanus/ipc/rings.py)."""
        budget.resize(self.prefix, self.held())
        log.info(
            "model instance '%s': shared-memory rings now %s to the stub, %s back "
            "(--backend-config=python,shm-growth-byte-size)",
            name,
            budget.human(self.writer.capacity),
            budget.human(self.reader.capacity),
        )

    def close_rings(self) -> None:
        self.writer.close()
        self.reader.close()
        budget.drop(self.prefix)

    def remove_files(self) -> None:
        """One-off files of messages the stub died before reading."""
        for path in glob.glob(f"{self.prefix}-*"):
            unlink(path)


def spawn(
    name: str,
    generation: int,
    init: Callable[[str, str, int, str], msg.Init],
    capacity: int,
    metrics: MetricOwner,
    on_message: Callable[[Stub, msg.Message], None],
    python_env: PythonEnv | None = None,
    growth: int = 0,
    label: str = "",
) -> Stub:
    """Start a stub and wait for its initialize(); raises with the model's error.

    `init(s2w, w2s, capacity, spill prefix)` makes the Init message; `capacity` is each ring's
    size at start, `growth` the step by which the server's ring grows (the stub's grows by the
    step Init names); `on_message` serves what the model sends before it is ready (log lines,
    metrics, model control); `python_env` is the model's own environment (EXECUTION_ENV_PATH),
    None for the server's interpreter; `label` names the rings on the status page (the model)."""
    tag = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
    prefix = f"{tp.shm_dir()}/oceanus-py-{os.getpid()}-{tag}-{generation}-{uuid.uuid4().hex[:8]}"
    s2w, w2s = f"{prefix}-s2w", f"{prefix}-w2s"
    try:
        tp.create_ring_file(s2w, capacity)
        tp.create_ring_file(w2s, capacity)
    except budget.ShmFull as full:
        unlink(s2w)
        raise shm_error(name, 2 * (tp.RING_HEADER + capacity), full) from None
    budget.hold(prefix, 2 * (tp.RING_HEADER + capacity), label)
    parent, child = socket.socketpair()
    process: subprocess.Popen[bytes] | None = None
    channel = tp.Channel(parent)
    try:
        process = subprocess.Popen(
            stub_command(child.fileno(), python_env),
            pass_fds=(child.fileno(),),
            env=stub_env(python_env),
        )
        child.close()
        writer = tp.RingWriter(s2w, capacity, f"{prefix}-s-", growth)
        reader = tp.RingReader(w2s, capacity)
        stub = Stub(generation, process, channel, writer, reader, prefix, metrics, False)
        writer.on_grow = reader.on_grow = lambda _capacity: stub.rings_resized(name)
        channel.send(init(s2w, w2s, capacity, f"{prefix}-w-"))
        while True:
            try:
                message = channel.recv()
            except (EOFError, OSError):
                raise internal(
                    f"Failed to initialize the stub process of model instance '{name}': "
                    f"{exit_text(process.wait())}"
                ) from None
            if isinstance(message, msg.Ready):
                break
            if message is not None:
                on_message(stub, message)
        if message.error is not None:
            raise internal(str(message.error))
    except BaseException:
        budget.drop(prefix)
        channel.close()
        child.close()
        if process is not None:
            process.kill()
            process.wait()
        raise
    finally:
        # Both ends have mapped the rings (or never will): the names are no longer needed, and
        # nothing is left behind in /dev/shm whatever happens to either process.
        unlink(s2w)
        unlink(w2s)
    stub.has_is_ready = bool(message.result)
    return stub


def shm_error(instance: str, needed: int, full: budget.ShmFull) -> InferenceServerError:
    """The load error when an instance's rings do not fit in /dev/shm: what, how much, the way
    out (docs/python-backend.md, "Shared memory budget")."""
    return unavailable(
        f"failed to reserve shared memory for model instance '{instance}': its two rings need "
        f"{budget.human(needed)} and {budget.shm_dir()} has {budget.human(full.free)} free of "
        f"{budget.human(full.size)}. Give the server more shared memory (docker run "
        "--shm-size, a larger memory-backed /dev/shm volume), use smaller rings "
        "(--backend-config=python,shm-default-byte-size=<bytes for both rings>; they grow by "
        "shm-growth-byte-size when a message needs more), or load fewer instances "
        "(instance_group count)"
    )


def run_autocomplete(
    model_path: Path, config_json: str, python_env: PythonEnv | None = None
) -> str:
    """Call the model's static auto_complete_config in a short-lived stub."""
    parent, child = socket.socketpair()
    process = subprocess.Popen(
        stub_command(child.fileno(), python_env),
        pass_fds=(child.fileno(),),
        env=stub_env(python_env),
    )
    child.close()
    channel = tp.Channel(parent)
    try:
        channel.send(msg.Autocomplete(str(model_path), config_json))
        try:
            answer = channel.recv()
        except EOFError:
            raise internal(
                f"auto_complete_config of '{model_path}' failed: {exit_text(process.wait())}"
            ) from None
    finally:
        channel.close()
        process.wait()
    assert isinstance(answer, msg.Ready)
    if answer.error is not None:
        raise internal(answer.error)
    return str(answer.result)


def stub_command(fd: int, python_env: PythonEnv | None = None) -> list[str]:
    python = python_env.python if python_env is not None else sys.executable
    return [python, "-m", "oceanus.backends.python.pb_stub", str(fd)]


def stub_env(python_env: PythonEnv | None = None) -> dict[str, str]:
    """The server's variables, with this package importable (a model's own environment does
    not have Oceanus installed) and that environment activated."""
    env = dict(os.environ)
    path = env.get("PYTHONPATH", "")
    root = python_env.stub_root if python_env is not None else _PACKAGE_ROOT
    if root not in path.split(os.pathsep):
        env["PYTHONPATH"] = root + (os.pathsep + path if path else "")
    return python_env.apply(env) if python_env is not None else env


def exit_text(returncode: int | None) -> str:
    if returncode is None:
        return "it stopped answering"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"the process was killed by {name}"
    return f"the process exited with status {returncode}"


def unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
