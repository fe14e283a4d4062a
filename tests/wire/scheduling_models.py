"""Python models (and their configs) the scheduling tests share: the same models were run on
Triton 2.51 for docs/triton-reference-behaviour.md ("Scheduling: rate limiter, oldest ...")."""

from __future__ import annotations

from pathlib import Path

# Sleeps 0.5 s per execution; answers the wall-clock interval it slept in.
SLEEPER = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        start = time.time()
        time.sleep(0.5)
        span = np.array([start, time.time()], dtype=np.float64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("SPAN", span)]) for _ in requests]
"""
SLEEPER_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "SPAN" data_type: TYPE_FP64 dims: [ 2 ] }} ]
instance_group [ {{ count: 2 kind: KIND_CPU
  rate_limiter {{ resources [ {{ name: "R1" count: {count} }} ] priority: {priority} }} }} ]
"""

# Answers request.parameters() (a JSON text), as Triton's Python backend gives it.
PARAMS = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", np.array([r.parameters()], dtype=object))]
            )
            for r in requests
        ]
"""
PARAMS_CONFIG = """
name: "params"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

# Decoupled: one response per element of IN, then the final flag alone.
REPEAT = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            for value in values.reshape(-1):
                out = pb_utils.Tensor("OUT", np.array([value], dtype=np.int32))
                sender.send(pb_utils.InferenceResponse([out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
REPEAT_CONFIG = """
name: "repeat"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
PLUS_ONE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() + 1)]
            )
            for r in requests
        ]
"""
PLUS_ONE_CONFIG = """
name: "plus_one"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""
# plus_one, then repeat: the ensemble streams repeat's responses.
REPEAT_ENSEMBLE_CONFIG = """
name: "repeat_ensemble"
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "plus_one" model_version: -1
    input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "X" } },
  { model_name: "repeat" model_version: -1
    input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "OUT" } }
] }
"""


def write_python_model(repository: Path, name: str, config: str, source: str | None) -> None:
    folder = repository / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(config)
    if source is not None:
        (folder / "1" / "model.py").write_text(source)


def write_sleeper(
    repository: Path, name: str = "sleeper", count: int = 1, priority: int = 1
) -> None:
    config = SLEEPER_CONFIG.format(name=name, count=count, priority=priority)
    write_python_model(repository, name, config, SLEEPER)


def write_repeat_ensemble(repository: Path) -> None:
    write_python_model(repository, "repeat", REPEAT_CONFIG, REPEAT)
    write_python_model(repository, "plus_one", PLUS_ONE_CONFIG, PLUS_ONE)
    write_python_model(repository, "repeat_ensemble", REPEAT_ENSEMBLE_CONFIG, None)
