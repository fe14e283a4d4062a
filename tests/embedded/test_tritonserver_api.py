"""`oceanus.tritonserver`: NVIDIA's in-process API examples with one import line changed, and the
call shapes around them (models(), model metadata/config/statistics, errors, load/unload)."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from pathlib import Path

import numpy
import pytest

import oceanus.tritonserver as tritonserver


@pytest.fixture(scope="module")
def server(embedded_repository: Path) -> Iterator[tritonserver.Server]:
    started = tritonserver.Server(model_repository=str(embedded_repository)).start(
        wait_until_ready=True
    )
    yield started
    started.stop()


def test_nvidia_hello_world(embedded_repository: Path) -> None:
    # NVIDIA's hello world (core/python/README and the tutorials' Triton_Inference_Server_
    # Python_API), as written there but for its first line (`import tritonserver`).
    source = f"""
import oceanus.tritonserver as tritonserver

server = tritonserver.Server(model_repository="{embedded_repository}")
server.start()
print(server.models())
model = server.model("identity")
responses = model.infer(inputs={{"string_input":[["hello world!"]]}})
for response in responses:
    print(response.outputs["string_output"].to_string_array())
server.stop()
"""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(source, "hello_world.py", "exec"), {})
    lines = printed.getvalue().splitlines()
    assert "('identity', 1): {'name': 'identity', 'version': 1, 'state': 'READY'}" in lines[0]
    assert lines[1] == "[['hello world!']]"


def test_request_object_and_dlpack_output(server: tritonserver.Server) -> None:
    # The InferenceRequest docstring's example: a request made explicitly, read with DLPack.
    request = server.model("identity_fp16").create_request()
    request.inputs["fp16_input"] = numpy.array([[1.0]]).astype(numpy.float16)
    for response in server.model("identity_fp16").infer(request):
        assert response.final
        output = numpy.from_dlpack(response.outputs["fp16_output"])
        assert output.dtype == numpy.float16 and output.tolist() == [[1.0]]
        assert response.outputs["fp16_output"].data_type is tritonserver.DataType.FP16
    tensor = tritonserver.Tensor.from_string_array([["a", "b"]])
    (response,) = server.model("identity").infer(inputs={"string_input": tensor})
    assert response.outputs["string_output"].to_bytes_array().tolist() == [[b"a", b"b"]]


def test_models_metadata_config_statistics(server: tritonserver.Server) -> None:
    models = server.models()
    assert models[("simple", 1)].state == "READY"
    assert models["simple"].version == -1  # a plain name: the highest ready version
    assert server.live() and server.ready()
    assert server.metadata()["name"] == "oceanus"
    model = server.model("simple")
    assert model.ready()
    metadata = model.metadata()
    assert [i["name"] for i in metadata["inputs"]] == ["INPUT0", "INPUT1"]
    assert model.config()["max_batch_size"] == 8
    assert model.batch_properties() is tritonserver.ModelBatchFlag.FIRST_DIM
    assert server.model("repeat").transaction_properties() is (
        tritonserver.ModelTxnPropertyFlag.DECOUPLED
    )
    before = model.statistics()["model_stats"][0]["inference_count"]
    a = numpy.ones((1, 16), numpy.int32)
    list(model.infer(inputs={"INPUT0": a, "INPUT1": a}))
    assert model.statistics()["model_stats"][0]["inference_count"] == before + 1
    assert "nv_inference_count" in server.metrics()


def test_errors_carry_triton_classes_and_texts(server: tritonserver.Server) -> None:
    a = numpy.ones((1, 16), numpy.int32)
    with pytest.raises(tritonserver.NotFoundError, match="Request for unknown model: 'nope'"):
        list(server.model("nope").infer(inputs={"INPUT0": a}))
    with pytest.raises(tritonserver.InvalidArgumentError, match="INPUT1"):
        list(server.model("simple").infer(inputs={"INPUT0": a}))
    responses = list(server.model("simple").infer(inputs={"INPUT0": a}, raise_on_error=False))
    assert isinstance(responses[0].error, tritonserver.InvalidArgumentError)
    with pytest.raises(tritonserver.InvalidArgumentError, match="Server not started"):
        tritonserver.Server(model_repository="unused").model("simple")


def test_explicit_load_and_unload(embedded_repository: Path) -> None:
    options = tritonserver.Options(
        model_repository=str(embedded_repository),
        model_control_mode=tritonserver.ModelControlMode.EXPLICIT,
    )
    server = tritonserver.Server(options).start(wait_until_ready=True)
    try:
        assert ("simple", 1) not in server.models()
        model = server.load("simple")
        assert model.ready()
        config = model.config()
        config["max_batch_size"] = 4
        reloaded = server.load("simple", {"config": json.dumps(config)})
        assert reloaded.config()["max_batch_size"] == 4
        server.unload("simple", wait_until_unloaded=True)
        assert not server.model("simple").ready()
        assert server.models()[("simple", 1)].state == "UNAVAILABLE"
    finally:
        server.stop()
    assert not server._core  # stopped: a second stop is a no-op
    server.stop()
