"""Implicit state (`sequence_batching { state [ ... ] }`): the server carries a sequence's state.

Each `state` entry names a model input (`input_name`) and a model output (`output_name`) that the
config's `input`/`output` sections do not list. Before a sequence's request executes, the
scheduler adds the input: the sequence's state, or on its START request the initial state
(`initial_state { zero_data: true }` or `data_file` under `<model>/initial_state/`, else zeros
with variable dimensions as 1, as Triton does). After it executes, the output becomes the
sequence's state for its next request (a state whose `dims` hold -1 may change shape: growing
state). The state lives on the sequence object, so it is freed with the sequence (END, idle
timeout, unload). Clients never see it: the state tensors are not inputs or outputs a request
may name. Validation follows core sequence_batch_scheduler.cc (its texts). See
docs/sequence-batching.md, "Implicit state".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.core import datatypes
from oceanus.core.errors import invalid_arg

INITIAL_STATE_FOLDER = "initial_state"

States = dict[str, np.ndarray]


@dataclass(frozen=True, slots=True)
class StateSpec:
    input_name: str
    output_name: str
    initial: np.ndarray  # with the batch dimension when the model batches


def _dtype(data_type: int) -> np.dtype[Any]:
    datatype = datatypes.from_config_name(mc.DataType.Name(data_type))
    if datatype is None:
        raise invalid_arg(f"unsupported state data type {mc.DataType.Name(data_type)}")
    return datatype.dtype


def validate_states(config: mc.ModelConfig) -> None:
    """The checks of the config alone (names), before any file is read."""
    inputs = {t.name for t in config.input}
    outputs = {t.name for t in config.output}
    seen: set[str] = set()
    for state in config.sequence_batching.state:
        if not state.input_name or not state.output_name:
            raise invalid_arg(
                f"sequence batching state of model '{config.name}' must specify both "
                "'input_name' and 'output_name'"
            )
        if state.input_name in seen:
            raise invalid_arg(f"State input name '{state.input_name}' specified more than once.")
        seen.add(state.input_name)
        if state.input_name in inputs or state.output_name in outputs:
            raise invalid_arg(
                f"sequence batching state '{state.input_name}' of model '{config.name}': state "
                "tensors must not be listed in 'input' or 'output'"
            )
        if state.data_type == mc.TYPE_INVALID or not state.dims:
            raise invalid_arg(
                f"sequence batching state '{state.input_name}' of model '{config.name}' must "
                "specify 'data_type' and 'dims'"
            )
        if len(state.initial_state) > 1:
            raise invalid_arg(
                f"initial_state field for state input '{state.input_name}' must contain exactly "
                f"one or zero element. Found '{len(state.initial_state)}' elements."
            )


def state_specs(config: mc.ModelConfig, model_dir: Path) -> list[StateSpec]:
    """Each state with its initial value (reads `initial_state` data files; Triton's texts)."""
    batched = config.max_batch_size > 0
    specs: list[StateSpec] = []
    for state in config.sequence_batching.state:
        dtype = _dtype(state.data_type)
        if state.initial_state:
            initial = _initial_value(state, state.initial_state[0], dtype, model_dir)
        else:
            shape = [1 if dim == -1 else dim for dim in state.dims]
            initial = (
                np.full(shape, b"", dtype=object) if dtype.kind == "O" else np.zeros(shape, dtype)
            )
        if batched:
            initial = initial.reshape([1, *initial.shape])
        initial.flags.writeable = False  # shared by every sequence's first request
        specs.append(StateSpec(state.input_name, state.output_name, initial))
    return specs


def _initial_value(
    state: mc.ModelSequenceBatching.State,
    initial: mc.ModelSequenceBatching.InitialState,
    dtype: np.dtype[Any],
    model_dir: Path,
) -> np.ndarray:
    name = state.input_name
    if initial.data_type != state.data_type:
        raise invalid_arg(
            f"The data type used for 'initial_state' field of state '{name}' does not match the "
            "state data type."
        )
    if not initial.name:
        raise invalid_arg(
            f"Field 'name' must be set when using initial_state for state input '{name}'."
        )
    if len(initial.dims) != len(state.dims):
        raise invalid_arg(
            "Number of dimensions in 'initial_state' doesn't match the size of 'state' "
            f"dimensions for state input '{name}'. {len(initial.dims)} != {len(state.dims)}"
        )
    for dim, state_dim in zip(initial.dims, state.dims, strict=True):
        if dim == -1:
            raise invalid_arg(
                f"'initial_state' field for state input name '{name}' contains variable dimensions."
            )
        if state_dim != -1 and dim != state_dim:
            raise invalid_arg(
                f"'initial_state' dim for input name '{name}' doesn't match 'state' dim "
                f"description. {dim} != {state_dim}"
            )
    shape = list(initial.dims)
    kind = initial.WhichOneof("state_data")
    if kind == "zero_data":
        if dtype.kind == "O":
            return np.full(shape, b"", dtype=object)
        return np.zeros(shape, dtype)
    if kind != "data_file":
        raise invalid_arg(f"initial_state setting expects state'{name}' to have state_data set")
    path = model_dir / INITIAL_STATE_FOLDER / initial.data_file
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise invalid_arg(f"unable to read initial state file '{path.name}': {exc}") from None
    if dtype.kind == "O":
        return np.full(shape, data, dtype=object)
    size = int(np.prod(shape)) * dtype.itemsize
    if size > len(data):
        raise invalid_arg(
            f"initial_state setting expects {size} bytes, but the data provided from "
            f"{initial.data_file}only has {len(data)} bytes."
        )
    value: np.ndarray = np.frombuffer(data[:size], dtype=dtype).reshape(shape).copy()
    return value


class StateKeeper:
    """The states of one model version's sequences (used by the sequence schedulers)."""

    def __init__(self, specs: list[StateSpec]) -> None:
        self._specs = specs

    def add_inputs(self, inputs: dict[str, np.ndarray], states: States | None) -> None:
        """Put each state input into a request's inputs: the sequence's state, or the initial
        one (`states` None: a START request, or the state was never written)."""
        for spec in self._specs:
            value = None if states is None else states.get(spec.input_name)
            inputs[spec.input_name] = spec.initial if value is None else value

    def updated(self, states: States | None, outputs: dict[str, np.ndarray]) -> States:
        """The sequence's states after a request: each state output the model produced (a
        copy, so the batch's output buffer is not kept alive), else the state it had."""
        fresh: States = dict(states) if states else {}
        for spec in self._specs:
            value = outputs.pop(spec.output_name, None)
            if value is not None:
                fresh[spec.input_name] = np.array(value, copy=True)
        return fresh
