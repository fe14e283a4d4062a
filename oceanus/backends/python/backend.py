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

from oceanus.backends.python import in_process
from oceanus.backends.python.exec_env import resolve as resolve_env
from oceanus.backends.python.instance import PythonInstance
from oceanus.backends.python.options import PythonOptions
from oceanus.backends.python.stub_launcher import run_autocomplete
from oceanus.core.backend import Backend, LoadContext, RequestInstance
from oceanus.core.errors import invalid_arg
from oceanus.proto_json import message_to_dict


class PythonBackend(Backend):
    name = "python"
    default_model_filename = "model.py"

    def __init__(self, options: PythonOptions | None = None) -> None:
        self.options = options or PythonOptions()

    def complete_config(self, config: mc.ModelConfig, model_path: Path, autocomplete: bool) -> None:
        if not autocomplete:
            return
        try:
            source = model_path.read_text(errors="replace")
        except OSError as exc:
            raise invalid_arg(f"failed to read {model_path}: {exc.strerror}") from None
        if "auto_complete_config" not in source:
            return  # no need to start a process to learn that
        # auto_complete_config runs in the model's own environment too, as in Triton.
        python_env = resolve_env(config, model_path.parent.parent)
        completed = run_autocomplete(model_path, json.dumps(message_to_dict(config)), python_env)
        try:
            parsed = json_format.ParseDict(json.loads(completed), mc.ModelConfig())
        except (json_format.ParseError, ValueError) as exc:
            raise invalid_arg(
                f"auto_complete_config of model '{config.name}' returned an invalid config: {exc}"
            ) from None
        config.CopyFrom(parsed)

    def load(self, context: LoadContext) -> RequestInstance:
        if in_process.wanted(context.config):
            return in_process.InProcessInstance(context)
        return PythonInstance(context, self.options)
