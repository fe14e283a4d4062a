"""Ensemble config checks made before any composing model is looked at (Triton's texts)."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.core.ensemble import steps as ensemble
from oceanus.core.errors import InferenceServerError

HEADER = """
name: "e"
platform: "ensemble"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


def step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    maps = "".join(f' input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    maps += "".join(f' output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: -1 {maps} }}'


def config(*steps: str, extra: str = "") -> mc.ModelConfig:
    text = HEADER + extra + "ensemble_scheduling { step [ " + ", ".join(steps) + " ] }"
    return text_format.Parse(text, mc.ModelConfig())


def error(model: mc.ModelConfig) -> str:
    with pytest.raises(InferenceServerError) as caught:
        ensemble.validate_config(model)
    return caught.value.message


def test_a_two_step_chain_is_valid() -> None:
    ensemble.validate_config(
        config(step("a", {"X": "IN"}, {"Y": "mid"}), step("b", {"X": "mid"}, {"Y": "OUT"}))
    )


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        (
            [step("a", {"X": "IN"}, {"Y": "mid"})],
            "ensemble output 'OUT' for ensemble 'e' is not used: no step's output_map writes it",
        ),
        (
            [step("a", {"X": "other"}, {"Y": "OUT"})],
            "ensemble input 'IN' for ensemble 'e' is not used: no step's input_map reads it",
        ),
        (
            # OUT needs "loop", which only a step reading OUT's own chain writes: a cycle
            [
                step("a", {"X": "IN", "Z": "loop"}, {"Y": "OUT"}),
                step("b", {"X": "OUT"}, {"Y": "loop"}),
            ],
            "output 'OUT' for ensemble 'e' is not written: at least one of its depending "
            "tensors, 'loop', is not connected",
        ),
        (
            [step("a", {"X": "IN"}, {"Y": "OUT"}), step("b", {"X": "IN"}, {"Y": "OUT"})],
            "ensemble tensor 'OUT' can appear in an output map only once for ensemble 'e' step 1",
        ),
        (
            [step("a", {"X": "IN"}, {"Y": "OUT", "Z": "spare"})],
            "ensemble tensor 'spare' is unused in ensemble 'e'",
        ),
        (
            [step("a", {}, {"Y": "OUT"})],
            "must specify 'input_map' in step 0 of ensemble 'e'",
        ),
    ],
)
def test_bad_data_flow_is_named(steps: list[str], message: str) -> None:
    assert error(config(*steps)) == message


def test_ensemble_only_fields() -> None:
    good = step("a", {"X": "IN"}, {"Y": "OUT"})
    assert error(config(good, extra="instance_group [ { count: 2 } ]\n")) == (
        "instance group should not be specified for ensemble 'e'"
    )
    no_steps = text_format.Parse(HEADER, mc.ModelConfig())
    assert error(no_steps) == (
        "ensemble scheduling must be set for ensemble 'e' whose platform is ensemble"
    )
    not_ensemble = config(good)
    not_ensemble.platform = "onnxruntime_onnx"
    assert error(not_ensemble) == (
        "ensemble scheduling cannot be set for model 'e' whose platform is not ensemble"
    )


def test_cycles_between_ensembles_are_found() -> None:
    first = config(step("f", {"X": "IN"}, {"Y": "OUT"}))
    second = config(step("e", {"X": "IN"}, {"Y": "OUT"}))
    second.name = "f"
    assert ensemble.find_cycle("e", first, {"f": second}) == ["e", "f", "e"]
    plain = mc.ModelConfig(name="f", platform="onnxruntime_onnx")
    assert ensemble.find_cycle("e", first, {"f": plain}) is None
    itself = config(step("e", {"X": "IN"}, {"Y": "OUT"}))
    assert ensemble.find_cycle("e", itself, {}) == ["e", "e"]
