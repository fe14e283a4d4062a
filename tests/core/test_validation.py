"""Requests checked against their model's config (core/validation.py), in process, with Triton's
texts: every frontend hands the core the same InferRequest, so the rules are tested once here;
the frontends' tests check how each protocol carries the error."""

from __future__ import annotations

import numpy as np
import pytest

from oceanus.core.errors import ErrorCode, InferenceServerError
from oceanus.core.server import ServerCore
from oceanus.core.types import InferRequest, RequestedOutput, Tensor
from tests.core.fakes import World

TWO_INPUTS = """
input [ { name: "A" data_type: TYPE_INT32 dims: [ 3 ] },
        { name: "B" data_type: TYPE_FP32 dims: [ -1, 2 ] },
        { name: "OPT" data_type: TYPE_INT32 dims: [ 1 ] optional: true } ]
output [ { name: "A_OUT" data_type: TYPE_INT32 dims: [ 3 ] } ]
"""
STRINGS = """
input [ { name: "S" data_type: TYPE_STRING dims: [ 2 ] } ]
output [ { name: "S_OUT" data_type: TYPE_STRING dims: [ 2 ] } ]
"""
NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension "
    "to be prepended to each input shape. If you want to specify the full shape including the "
    "batch dim in your input dims config, try setting max_batch_size to zero. See the model "
    "configuration docs for more info on max_batch_size."
)


def tensor(name: str, datatype: str, shape: tuple[int, ...], data: np.ndarray) -> Tensor:
    return Tensor(name, datatype, shape, data)


def a(rows: int = 1, shape: tuple[int, ...] | None = None, count: int | None = None) -> Tensor:
    shape = shape or (rows, 3)
    size = count if count is not None else int(np.prod(shape))
    return tensor("A", "INT32", shape, np.arange(size, dtype=np.int32))


def b(rows: int = 1, width: int = 5) -> Tensor:
    shape = (rows, width, 2)
    return tensor("B", "FP32", shape, np.zeros(int(np.prod(shape)), np.float32))


@pytest.fixture
def checked(world: World) -> World:
    world.add("m", TWO_INPUTS, max_batch_size=4)
    world.add("flat", TWO_INPUTS, max_batch_size=0)
    world.add("strings", STRINGS, max_batch_size=0)
    return world


def refusals(world: World, requests: list[InferRequest]) -> list[str]:
    """What the core answers each request (each must be refused before it is queued)."""

    async def scenario(core: ServerCore) -> list[str]:
        messages = []
        for request in requests:
            with pytest.raises(InferenceServerError) as caught:
                core.infer(request, "test")
            assert caught.value.code == ErrorCode.INVALID_ARG, caught.value.message
            messages.append(caught.value.message)
        # refused requests are neither executed nor counted
        assert not world.model("m").executed and not world.model("flat").executed
        assert core.statistics("m")[0]["inference_stats"]["fail"]["count"] == 0
        return messages

    return world.run(scenario)


def test_names_datatypes_and_counts(checked: World) -> None:
    def request(*tensors: Tensor, **fields: object) -> InferRequest:
        return InferRequest("m", inputs=list(tensors), **fields)  # type: ignore[arg-type]

    assert refusals(
        checked,
        [
            request(a(), b(), tensor("C", "INT32", (1, 1), np.zeros(1, np.int32))),
            request(a(), a(), b(), id="r1"),
            request(tensor("A", "FP32", (1, 3), np.zeros(3, np.float32)), b(), id="r2"),
            request(a()),
            request(a(), b(), outputs=[RequestedOutput("NOPE")]),
        ],
    ) == [
        "unexpected inference input 'C' for model 'm'",
        "[request id: r1] input 'A' already exists in request",
        "[request id: r2] inference input 'A' data-type is 'FP32', but model 'm' expects 'INT32'",
        # OPT is optional: Triton's text gives the range
        "[request id: <id_unknown>] expected number of inputs between 2 and 3 but got 1 inputs "
        "for model 'm'. Got "
        "input(s) ['A'], but missing required input(s) ['B']. Please provide all required "
        "input(s).",
        "unexpected inference output 'NOPE' for model 'm'",
    ]


def test_shapes_and_batch_sizes(checked: World) -> None:
    def request(*tensors: Tensor, model: str = "m") -> InferRequest:
        return InferRequest(model, inputs=list(tensors))

    prefix = "[request id: <id_unknown>] "
    flat_b = tensor("B", "FP32", (5, 2), np.zeros(10, np.float32))  # right for "flat"
    assert refusals(
        checked,
        [
            request(a(rows=5), b(rows=5)),
            request(a(rows=2), b(rows=3)),
            request(a(shape=(1, 4)), b()),
            request(a(shape=(3,)), b(rows=3)),  # rows agree (checked first), A lacks a dim
            request(a(shape=(1, 3)), flat_b, model="flat"),
            request(a(count=4), b()),
            request(a(shape=(0, 3), count=0), b(rows=0)),
        ],
    ) == [
        f"{prefix}inference request batch-size must be <= 4 for 'm'",
        # the first input in Triton's hash map order (core/validation_order.py) whose rows differ
        # from the first one's: for A and B that order is B, A
        f"{prefix}input 'A' batch size does not match other inputs for 'm'",
        f"{prefix}unexpected shape for input 'A' for model 'm'. Expected [-1,3], got [1,4]. "
        + NOTE,
        f"{prefix}unexpected shape for input 'A' for model 'm'. Expected [-1,3], got [3]. " + NOTE,
        # Triton keeps the trailing space when there is no NOTE
        f"{prefix}unexpected shape for input 'A' for model 'flat'. Expected [3], got [1,3]. ",
        f"{prefix}input byte size mismatch for input 'A' for model 'm'. Expected 12, got 16",
        # a batch of 0 is sized as a batch of 1, as Triton sizes it
        f"{prefix}input byte size mismatch for input 'B' for model 'm'. Expected 40, got 0",
    ]


def test_strings_count_elements(checked: World) -> None:
    strings = np.array([b"x", b"y", b"z"], dtype=object)
    assert refusals(
        checked, [InferRequest("strings", inputs=[tensor("S", "BYTES", (2,), strings)])]
    ) == [
        "[request id: <id_unknown>] expected 2 string elements for inference input 'S' for "
        "model 'strings', got 3"
    ]


def test_valid_requests_get_their_final_shapes(checked: World) -> None:
    """Flat arrays as a frontend decodes them take the declared shape; optional inputs may be
    left out; variable dimensions take any size."""
    model = checked.model("m")

    async def scenario(core: ServerCore) -> None:
        request = InferRequest("m", inputs=[a(rows=2), b(rows=2, width=7)])
        response = await core.infer(request, "test")
        assert response.outputs[0].data.tolist() == [[0, 1, 2], [3, 4, 5]]
        executed = model.executed[0].inputs
        assert {n: v.shape for n, v in executed.items()} == {"A": (2, 3), "B": (2, 7, 2)}

    checked.run(scenario)
