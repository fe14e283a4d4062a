"""config.pbtxt text for `model_warmup` samples, shared by the in-process warmup rules and the
wire warmup tests."""

from __future__ import annotations


def warmup_input(name: str, choice: str, dims: str = "16", datatype: str = "TYPE_INT32") -> str:
    """One entry of a sample's `inputs` map; `choice` is zero_data, random_data or a file."""
    return (
        f'inputs {{ key: "{name}" value: {{ data_type: {datatype} dims: [ {dims} ] {choice} }} }}'
    )


def warmup_sample(name: str, inputs: list[str], batch_size: int = 1, count: int = 0) -> str:
    """One `model_warmup` sample; count 0 leaves the field out (Triton runs it once)."""
    text = f'{{ name: "{name}" batch_size: {batch_size} ' + " ".join(inputs)
    return text + (f" count: {count} }}" if count else " }")
