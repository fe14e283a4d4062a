"""The sequence batcher (`sequence_batching`, direct strategy) on a real server: control tensors
reach an ONNX model with the right values over HTTP and gRPC, both protocols deliver the
sequence parameters, and a Python model keeps per-sequence state with its requests batched
(checked against Triton 2.51, docs/sequence-batching.md). The batcher's rules (slots, backlog,
idle timeouts, every mistake's text) are tested in process:
tests/core/test_sequence_batching_rules.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from oceanus.examples._graph import GraphBuilder

CONTROLS = """
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
"""
ONNX_IO = """
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "CORRID_OUT" data_type: TYPE_UINT64 dims: [ 1 ] } ]
"""

# A running sum per correlation ID; also reports the control tensors, the flags and the number
# of requests in the batch it ran in.
SUM_MODEL = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        time.sleep(0.02)
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            cid = request.correlation_id()
            flags = request.flags()
            controls = []
            for name in ("START", "READY", "END", "CORRID"):
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                controls.append(-1 if tensor is None else int(tensor.as_numpy().reshape(-1)[0]))
            if flags & 1:
                self.sums[cid] = 0
            self.sums[cid] = self.sums.get(cid, 0) + int(x.sum())
            total = self.sums[cid]
            if flags & 2:
                self.sums.pop(cid, None)
            info = np.array([controls + [flags, len(requests)]], dtype=np.int64)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT", np.full(x.shape, total, dtype=np.int32)),
                pb_utils.Tensor("INFO", info)]))
        return responses
"""
SUM_IO = """
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "INFO" data_type: TYPE_INT64 dims: [ 6 ] } ]
"""


def build_control_model() -> onnx.ModelProto:
    """OUTPUT = INPUT * READY + START * 100 + END * 1000, CORRID_OUT = CORRID."""
    b = GraphBuilder("seq_onnx", seed=0)
    value = b.op("Mul", ["INPUT", "READY"])
    start = b.op("Mul", ["START", b.const(np.array(100, dtype=np.int32))])
    end = b.op("Mul", ["END", b.const(np.array(1000, dtype=np.int32))])
    b.op("Add", [b.op("Add", [value, start]), end], output="OUTPUT")
    b.op("Identity", ["CORRID"], output="CORRID_OUT")

    def info(name: str, elem: int = TensorProto.INT32) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, elem, ["batch", 1])

    inputs = [info(n) for n in ("INPUT", "START", "READY", "END")]
    inputs.append(info("CORRID", TensorProto.UINT64))
    return b.model(inputs, [info("OUTPUT"), info("CORRID_OUT", TensorProto.UINT64)])


def add_onnx(repository: Path, name: str, max_batch: int, batching: str, count: int = 1) -> None:
    (repository / name / "1").mkdir(parents=True)
    onnx.save(build_control_model(), repository / name / "1" / "model.onnx")
    (repository / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {max_batch}\n{ONNX_IO}'
        f"sequence_batching {{ {batching} {CONTROLS} }}\n"
        f"instance_group [ {{ count: {count} kind: KIND_CPU }} ]\n"
    )


def add_python(repository: Path, name: str, max_batch: int, batching: str) -> None:
    (repository / name / "1").mkdir(parents=True)
    (repository / name / "1" / "model.py").write_text(SUM_MODEL)
    (repository / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: {max_batch}\n{SUM_IO}'
        f"sequence_batching {{ {batching} }}\n"
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
    )


@pytest.fixture(scope="module")
def seq_server(tmp_path_factory: pytest.TempPathFactory, launch_module: Any) -> Any:
    repository = tmp_path_factory.mktemp("sequence_models")
    add_onnx(repository, "seq_onnx", 4, "direct { } max_sequence_idle_microseconds: 5000000")
    add_python(repository, "seq_sum", 4, CONTROLS)
    add_python(repository, "seq_sum_plain", 0, "")
    return launch_module([repository])


def _infer(
    server: Any, protocol: str, model: str, value: int, **kwargs: Any
) -> dict[str, np.ndarray]:
    module: Any = httpclient if protocol == "http" else grpcclient
    client = (
        module.InferenceServerClient(server.http_url)
        if protocol == "http"
        else module.InferenceServerClient(server.grpc_url)
    )
    shape = [1] if model == "seq_sum_plain" else [1, 1]
    tensor = module.InferInput("INPUT", shape, "INT32")
    tensor.set_data_from_numpy(np.full(shape, value, dtype=np.int32))
    result = client.infer(model, [tensor], **kwargs)
    names = ("OUTPUT", "CORRID_OUT") if model.startswith("seq_onnx") else ("OUTPUT", "INFO")
    return {name: result.as_numpy(name) for name in names}


def _error(server: Any, protocol: str, model: str, **kwargs: Any) -> str:
    with pytest.raises(InferenceServerException) as caught:
        _infer(server, protocol, model, 1, **kwargs)
    return str(caught.value.message())


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_control_tensors_reach_an_onnx_model(seq_server: Any, protocol: str) -> None:
    corrid = 1001 if protocol == "http" else 2001
    steps = [
        (5, {"sequence_start": True}, 5 + 100),
        (6, {}, 6),
        (7, {}, 7),
        (8, {"sequence_end": True}, 8 + 1000),
    ]
    for value, flags, expected in steps:
        out = _infer(seq_server, protocol, "seq_onnx", value, sequence_id=corrid, **flags)
        assert out["OUTPUT"].tolist() == [[expected]]
        assert out["CORRID_OUT"].tolist() == [[corrid]]
    # a single-request sequence gets START and END together
    out = _infer(
        seq_server,
        protocol,
        "seq_onnx",
        1,
        sequence_id=corrid + 1,
        sequence_start=True,
        sequence_end=True,
    )
    assert out["OUTPUT"].tolist() == [[1101]]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_sequence_parameters_reach_the_core_as_sent(seq_server: Any, protocol: str) -> None:
    """Each protocol hands the core an absent ID as none and a string ID as a string (the
    rules and all their texts: tests/core/test_sequence_batching_rules.py)."""
    assert _error(seq_server, protocol, "seq_onnx") == (
        "inference request to model 'seq_onnx' must specify a non-zero or non-empty correlation ID"
    )
    # the CORRID control is an integer: string IDs are refused (Triton feeds their bytes)
    assert _error(seq_server, protocol, "seq_onnx", sequence_id="abc", sequence_start=True) == (
        "inference request for sequence abc to model 'seq_onnx': correlation ID in request "
        "is not an unsigned int"
    )


def test_python_model_keeps_state_per_sequence(seq_server: Any) -> None:
    """Answers compared with Triton 2.51 for the same requests (docs/sequence-batching.md)."""
    out = _infer(seq_server, "http", "seq_sum", 2, sequence_id=102, sequence_start=True)
    assert out["OUTPUT"].tolist() == [[2]]
    assert out["INFO"].tolist()[0][:5] == [1, 1, 0, 102, 1]  # START, READY, END, CORRID, flags
    out = _infer(seq_server, "grpc", "seq_sum", 3, sequence_id=102)
    assert out["OUTPUT"].tolist() == [[5]]
    assert out["INFO"].tolist()[0][:5] == [0, 1, 0, 102, 0]
    out = _infer(seq_server, "http", "seq_sum", 4, sequence_id=102, sequence_end=True)
    assert out["OUTPUT"].tolist() == [[9]]
    assert out["INFO"].tolist()[0][:5] == [0, 1, 1, 102, 2]
    # a START on a running sequence restarts it
    _infer(seq_server, "http", "seq_sum", 6, sequence_id=104, sequence_start=True)
    out = _infer(seq_server, "http", "seq_sum", 7, sequence_id=104, sequence_start=True)
    assert out["OUTPUT"].tolist() == [[7]]
    _infer(seq_server, "http", "seq_sum", 7, sequence_id=104, sequence_end=True)
    # no control inputs, no batching: string and integer IDs are both sequences
    out = _infer(seq_server, "grpc", "seq_sum_plain", 5, sequence_id="x", sequence_start=True)
    assert out["INFO"].reshape(-1).tolist()[:5] == [-1, -1, -1, -1, 1]
    out = _infer(seq_server, "http", "seq_sum_plain", 6, sequence_id="x", sequence_end=True)
    assert out["OUTPUT"].tolist() == [11]


def test_interleaved_sequences_keep_their_order_and_are_batched(seq_server: Any) -> None:
    """Four sequences at once, each request after the previous one of its sequence: every
    running sum is right (each sequence's requests ran in order on its own state), and ready
    requests of different sequences shared batches."""

    async def sequence(client: aioclient.InferenceServerClient, corrid: int) -> list[Any]:
        answers = []
        for step in range(1, 9):
            tensor = aioclient.InferInput("INPUT", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.full((1, 1), corrid * step, dtype=np.int32))
            result = await client.infer(
                "seq_sum",
                [tensor],
                sequence_id=corrid,
                sequence_start=step == 1,
                sequence_end=step == 8,
            )
            answers.append((result.as_numpy("OUTPUT")[0][0], result.as_numpy("INFO")[0]))
        return answers

    async def main() -> list[list[Any]]:
        client = aioclient.InferenceServerClient(seq_server.http_url)
        try:
            return await asyncio.gather(*(sequence(client, c) for c in (11, 12, 13, 14)))
        finally:
            await client.close()

    results = asyncio.run(main())
    batch_sizes = []
    for corrid, answers in zip((11, 12, 13, 14), results, strict=True):
        for step, (total, info) in enumerate(answers, start=1):
            assert total == corrid * step * (step + 1) // 2
            assert int(info[3]) == corrid
            batch_sizes.append(int(info[5]))
    assert max(batch_sizes) > 1


def test_oldest_loads_and_a_bad_control_is_refused(tmp_path: Path, launch: Any) -> None:
    add_onnx(tmp_path, "seq_oldest", 4, "oldest { max_candidate_sequences: 4 }")
    add_python(
        tmp_path,
        "seq_bad_control",
        4,
        'control_input [ { name: "S" control [ '
        "{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0 ] } ] } ]",
    )
    server = launch([tmp_path], ["--exit-on-error=false"])
    client = httpclient.InferenceServerClient(server.http_url)
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index["seq_oldest"]["state"] == "READY"  # tests/core/test_sequence_oldest.py
    assert (
        "sequence batching control 'int32_false_true' must have exactly 2 entries"
        in index["seq_bad_control"]["reason"]
    )
