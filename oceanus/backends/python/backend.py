"""The Python backend: Triton's `model.py` models, each instance in its own stub process.

This module checks and completes configs (a model's `auto_complete_config` runs in a one-off
stub); instance.py drives an instance's stub, stub_launcher.py starts one, server_calls.py serves
what a model asks of the server (BLS, model control, custom metrics), messages.py is what they send
each other over transport.py, and pb_stub.py is the stub process itself. pb_utils, the API
model.py files import, is utils.py over the pb/ package. See docs/python-backend.md.
"""

from __future__ import annotations

import json
from pathlib import Path

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.backends.python import transport as tp
from oceanus.backends.python.instance import PythonInstance
from oceanus.backends.python.stub_launcher import run_autocomplete
from oceanus.core.backend import Backend, LoadContext, RequestInstance
from oceanus.core.errors import invalid_arg
from oceanus.proto_json import message_to_dict

# The smallest ring `shm-default-byte-size` may ask for: below it almost every message would
# take the one-off path.
MIN_RING_BYTES = 64 << 10


class PythonBackend(Backend):
    name = "python"
    default_model_filename = "model.py"

    def __init__(self, options: dict[str, str] | None = None) -> None:
        # `--backend-config=python,shm-default-byte-size=N`: each of an instance's two rings
        # (Triton's option name; its meaning here: the fixed size of one ring).
        self.ring_bytes = tp.DEFAULT_RING_BYTES
        value = (options or {}).get("shm-default-byte-size")
        if value is not None:
            try:
                self.ring_bytes = int(value)
            except ValueError:
                self.ring_bytes = -1
            if self.ring_bytes < MIN_RING_BYTES:
                raise invalid_arg(
                    f"--backend-config=python,shm-default-byte-size={value}: expected a number "
                    f"of bytes, at least {MIN_RING_BYTES}"
                )

    def complete_config(self, config: mc.ModelConfig, model_path: Path, autocomplete: bool) -> None:
        if not autocomplete:
            return
        try:
            source = model_path.read_text(errors="replace")
        except OSError as exc:
            raise invalid_arg(f"failed to read {model_path}: {exc.strerror}") from None
        if "auto_complete_config" not in source:
            return  # no need to start a process to learn that
        completed = run_autocomplete(model_path, json.dumps(message_to_dict(config)))
        try:
            parsed = json_format.ParseDict(json.loads(completed), mc.ModelConfig())
        except (json_format.ParseError, ValueError) as exc:
            raise invalid_arg(
                f"auto_complete_config of model '{config.name}' returned an invalid config: {exc}"
            ) from None
        config.CopyFrom(parsed)

    def load(self, context: LoadContext) -> RequestInstance:
        return PythonInstance(context, self.ring_bytes)
