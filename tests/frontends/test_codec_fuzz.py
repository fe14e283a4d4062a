"""Property tests of the wire codecs and the config parser (hypothesis): whatever bytes come in,
the only failure is the protocol's own error (InferenceServerError, which every frontend maps to
a 4xx/5xx answer with its words), never a crash. Bounded for CI (`max_examples`); raise
HYPOTHESIS_EXAMPLES for a longer run.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from oceanus.core.datatypes import BY_NAME
from oceanus.core.errors import InferenceServerError
from oceanus.core.repository.model_config import parse_config_text
from oceanus.core.validation import TensorSpec, validate_request
from oceanus.frontends.grpc import codec as grpc_codec
from oceanus.frontends.http import codec as http_codec

EXAMPLES = int(os.environ.get("HYPOTHESIS_EXAMPLES", "300"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
DATATYPES = [*BY_NAME, "FP8", "", "int32"]
SPECS = {
    "INPUT0": TensorSpec("INPUT0", BY_NAME["INT32"], (16,)),
    "INPUT1": TensorSpec("INPUT1", BY_NAME["BYTES"], (-1,)),
}
OUTPUTS = {"OUTPUT0": TensorSpec("OUTPUT0", BY_NAME["INT32"], (16,))}

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=6), children)
    ),
    max_leaves=40,
)
shapes = st.lists(st.integers(min_value=-3, max_value=2**63 - 1) | st.just(16), max_size=4)
inputs = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["INPUT0", "INPUT1", "X", ""]) | st.text(max_size=4),
        "datatype": st.sampled_from(DATATYPES),
        "shape": shapes | json_values,
    },
    optional={
        "data": json_values,
        "parameters": st.dictionaries(
            st.sampled_from(
                ["binary_data_size", "shared_memory_region", "shared_memory_byte_size", "x"]
            ),
            json_values,
        ),
    },
)
documents = st.fixed_dictionaries(
    {"inputs": st.lists(inputs, max_size=3) | json_values},
    optional={
        "id": json_values,
        "outputs": st.lists(
            st.fixed_dictionaries(
                {"name": st.text(max_size=4)}, optional={"parameters": json_values}
            ),
            max_size=2,
        )
        | json_values,
        "parameters": json_values,
    },
)


def _validated(request: Any) -> None:
    """Decoded requests go on to the core's validation, which may refuse them, no more."""
    validate_request(request, "m", 8, SPECS, OUTPUTS)


@FUZZ
@given(documents, st.binary(max_size=64), st.booleans())
def test_http_bodies_fail_only_with_the_protocols_errors(
    document: dict[str, Any], tail: bytes, binary: bool
) -> None:
    header = json.dumps(document).encode()
    body = header + tail if binary else header
    try:
        request = http_codec.decode_infer_request(
            body, str(len(header)) if binary else None, "m", ""
        )
        _validated(request)
    except InferenceServerError:
        pass


@FUZZ
@given(st.binary(max_size=256), st.one_of(st.none(), st.text(max_size=6)))
def test_http_raw_bytes_fail_only_with_the_protocols_errors(
    body: bytes, header_length: str | None
) -> None:
    with contextlib.suppress(InferenceServerError):
        http_codec.decode_infer_request(body, header_length, "m", "")


tensors = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["INPUT0", "INPUT1", "Z"]),
        "datatype": st.sampled_from(DATATYPES),
        "shape": st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=3),
        "ints": st.lists(st.integers(min_value=-(2**31), max_value=2**31 - 1), max_size=20),
        "strings": st.lists(st.binary(max_size=5), max_size=5),
    }
)


@FUZZ
@given(st.lists(tensors, max_size=3), st.lists(st.binary(max_size=80), max_size=4), st.booleans())
def test_grpc_messages_fail_only_with_the_protocols_errors(
    items: list[dict[str, Any]], raw: list[bytes], use_raw: bool
) -> None:
    message = pb.ModelInferRequest(model_name="m")
    for item in items:
        tensor = message.inputs.add(name=item["name"], datatype=item["datatype"])
        tensor.shape.extend(item["shape"])
        if not use_raw:
            tensor.contents.int_contents.extend(item["ints"])
            tensor.contents.bytes_contents.extend(item["strings"])
    if use_raw:
        message.raw_input_contents.extend(raw)
    try:
        request = grpc_codec.decode(message.SerializeToString())
        _validated(request)
    except InferenceServerError:
        pass


@FUZZ
@given(st.binary(max_size=256))
def test_grpc_raw_bytes_fail_only_with_the_protocols_errors(data: bytes) -> None:
    with contextlib.suppress(InferenceServerError):
        grpc_codec.decode(data)


CONFIG = """name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]
dynamic_batching { preferred_batch_size: [ 4 ] }
"""


@FUZZ
@given(st.integers(min_value=0, max_value=len(CONFIG)), st.text(max_size=12), st.booleans())
def test_config_text_fails_only_with_the_protocols_errors(
    position: int, insert: str, replace: bool
) -> None:
    """A valid config.pbtxt with text inserted (or replacing what follows) anywhere."""
    end = position + len(insert) if replace else position
    text = CONFIG[:position] + insert + CONFIG[end:]
    with contextlib.suppress(InferenceServerError):
        parse_config_text(text, "config.pbtxt")


def test_the_properties_see_real_requests() -> None:
    """The strategies reach the success path too (a fuzzer that only sees errors proves
    little): a plain request decodes and validates."""
    document = {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
            {"name": "INPUT1", "datatype": "BYTES", "shape": [1, 2], "data": ["a", "b"]},
        ]
    }
    request = http_codec.decode_infer_request(json.dumps(document).encode(), None, "m", "")
    arrays, rows = validate_request(request, "m", 8, SPECS, OUTPUTS)
    assert rows == 1
    assert np.array_equal(arrays["INPUT0"], np.arange(16).reshape(1, 16))
