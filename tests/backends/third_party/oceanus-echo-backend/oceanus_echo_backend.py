"""A third-party Oceanus backend: each output is the input of the same position doubled."""

from __future__ import annotations

from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from oceanus.core.backend import Arrays, Backend, BatchInstance, LoadContext
from oceanus.core.backend_registry import BackendSpec
from oceanus.core.errors import invalid_arg


class EchoInstance(BatchInstance):
    def __init__(self, config: mc.ModelConfig) -> None:
        self.pairs = [(i.name, o.name) for i, o in zip(config.input, config.output, strict=True)]

    def execute(self, inputs: Arrays) -> Arrays:
        return {output: inputs[name] * 2 for name, output in self.pairs}


class EchoBackend(Backend):
    name = "echo"
    default_model_filename = "model.echo"

    def complete_config(self, config: mc.ModelConfig, model_path: Path, autocomplete: bool) -> None:
        # Inputs and outputs pair up by position; the file itself holds nothing.
        if len(config.input) != len(config.output):
            raise invalid_arg(
                f"model '{config.name}': the echo backend needs as many outputs as inputs, "
                f"got {len(config.input)} input(s) and {len(config.output)} output(s)"
            )

    def load(self, context: LoadContext) -> EchoInstance:
        return EchoInstance(context.config)


SPEC = BackendSpec("echo", EchoBackend, model_files={"model.echo": ""}, label="Echo")
