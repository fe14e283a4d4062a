"""`triton_python_backend_utils`, the API model.py files import, used outside a server."""

from __future__ import annotations

import json

import numpy as np
import pytest

import triton_python_backend_utils as pb_utils


def test_top_level_module_is_the_implementation() -> None:
    from oceanus.backends.python import utils

    assert pb_utils.Tensor is utils.Tensor
    assert set(utils.__all__) <= set(dir(pb_utils))


def test_tensor() -> None:
    array = np.arange(6, dtype=np.int16).reshape(2, 3)
    tensor = pb_utils.Tensor("T", array)
    assert tensor.name() == "T"
    assert tensor.as_numpy() is array
    assert tensor.triton_dtype() == 7
    assert tensor.shape() == [2, 3]
    assert tensor.is_cpu()
    back = pb_utils.Tensor.from_dlpack("U", tensor.to_dlpack())
    np.testing.assert_array_equal(back.as_numpy(), array)
    assert pb_utils.Tensor.from_dlpack("V", array).name() == "V"
    with pytest.raises(pb_utils.TritonModelException, match=r"Please use np\.object_ instead"):
        pb_utils.Tensor("S", np.array(["text"]))
    # an explicit Triton datatype reinterprets the bytes
    assert pb_utils.Tensor("R", np.zeros(4, np.uint8), triton_dtype=8).as_numpy().dtype == np.int32
    assert pb_utils.Tensor("B", np.array([b"x"], dtype=np.object_)).triton_dtype() == 13


def test_datatype_helpers() -> None:
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.triton_to_numpy_type(13) is np.object_
    assert pb_utils.numpy_to_triton_type(np.float16) == 10
    assert pb_utils.numpy_to_triton_type(np.bytes_) == 13
    assert pb_utils.numpy_to_triton_type(np.complex64) is None
    encoded = pb_utils.serialize_byte_tensor(np.array([b"ab", "c", b""], dtype=np.object_))
    assert encoded == b"\x02\x00\x00\x00ab\x01\x00\x00\x00c\x00\x00\x00\x00"
    assert pb_utils.deserialize_bytes_tensor(encoded).tolist() == [b"ab", b"c", b""]


def test_request_response_and_errors() -> None:
    tensor = pb_utils.Tensor("IN", np.ones(2, dtype=np.float32))
    request = pb_utils.InferenceRequest(
        model_name="m",
        inputs=[tensor],
        requested_output_names=["OUT"],
        parameters={"k": 1},
        request_id="r1",
        correlation_id=5,
    )
    assert pb_utils.get_input_tensor_by_name(request, "IN") is tensor
    assert pb_utils.get_input_tensor_by_name(request, "NOPE") is None
    assert json.loads(request.parameters()) == {"k": 1}
    assert (request.request_id(), request.correlation_id(), request.flags()) == ("r1", 5, 0)
    assert not request.is_cancelled()
    response = pb_utils.InferenceResponse(
        [pb_utils.Tensor("OUT", np.zeros(1))], parameters={"a": "b"}
    )
    assert pb_utils.get_output_tensor_by_name(response, "OUT") is not None
    assert not response.has_error() and json.loads(response.parameters()) == {"a": "b"}
    error = pb_utils.TritonError("gone", pb_utils.TritonError.NOT_FOUND)
    failed = pb_utils.InferenceResponse(error=error)
    assert failed.has_error() and failed.error() is error
    assert error.message() == "gone" and error.code() == pb_utils.TritonError.NOT_FOUND
    assert pb_utils.TritonError("x").code() == pb_utils.TritonError.INTERNAL
    with pytest.raises(pb_utils.TritonModelException, match=r'"output_tensors" must be a list\.'):
        pb_utils.InferenceResponse(output_tensors=(tensor,))  # type: ignore[arg-type]
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceResponse([], parameters={"bad": 1.5})


def test_config_helpers() -> None:
    config = {
        "input": [{"name": "A", "data_type": "TYPE_FP32"}],
        "output": [{"name": "B", "data_type": "TYPE_INT8"}],
        "model_transaction_policy": {"decoupled": True},
    }
    assert pb_utils.get_input_config_by_name(config, "A") == config["input"][0]  # type: ignore[index]
    assert pb_utils.get_output_config_by_name(config, "B") == config["output"][0]  # type: ignore[index]
    assert pb_utils.get_output_config_by_name(config, "A") is None
    assert pb_utils.using_decoupled_model_transaction_policy(config)
    assert not pb_utils.using_decoupled_model_transaction_policy({})


def test_auto_complete_model_config() -> None:
    config = pb_utils.ModelConfig(
        json.dumps(
            {
                "name": "m",
                "max_batch_size": 0,
                "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [4]}],
                "output": [],
            }
        )
    )
    config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [4]})  # same: fine
    config.add_output({"name": "B", "data_type": "TYPE_FP32", "dims": [4]})
    config.set_max_batch_size(8)
    config.set_dynamic_batching()
    config.set_model_transaction_policy({"decoupled": False})
    result = config.as_dict()
    assert result["max_batch_size"] == 8 and result["dynamic_batching"] == {}
    assert [o["name"] for o in result["output"]] == ["B"]
    with pytest.raises(
        ValueError,
        match="configuration expects datatype TYPE_FP32 for input 'A', model provides TYPE_INT32",
    ):
        config.add_input({"name": "A", "data_type": "TYPE_INT32", "dims": [4]})
    with pytest.raises(ValueError, match="contains property other than"):
        config.add_output({"name": "C", "data_type": "TYPE_FP32", "dims": [1], "format": "x"})
    with pytest.raises(ValueError, match="configuration specified max_batch_size 8"):
        config.set_max_batch_size(2)
    with pytest.raises(ValueError, match="trying to change decoupled property"):
        config.set_model_transaction_policy({"decoupled": True})


def test_response_sender_rules() -> None:
    from oceanus.backends.python.pb import runtime

    sent: list[tuple[int, object, int]] = []

    class Recorder(runtime.Runtime):
        def send_response(self, key: int, response: object, flags: int) -> None:
            sent.append((key, response, flags))

    previous = runtime.current()
    runtime.install(Recorder())
    try:
        sender = pb_utils.InferenceResponseSender(7, decoupled=True)
        sender.send(pb_utils.InferenceResponse([]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        with pytest.raises(pb_utils.TritonModelException, match="Response sender has been closed"):
            sender.send(pb_utils.InferenceResponse([]))
        with pytest.raises(pb_utils.TritonModelException, match="must be provided"):
            pb_utils.InferenceResponseSender(8, decoupled=True).send()
        single = pb_utils.InferenceResponseSender(9, decoupled=False)
        single.send(pb_utils.InferenceResponse([]))
        with pytest.raises(pb_utils.TritonModelException, match="more than one response"):
            single.send(pb_utils.InferenceResponse([]))
    finally:
        runtime.install(previous)
    assert [(k, f) for k, _, f in sent] == [(7, 0), (7, 1), (9, 0)]


def test_logger_and_metrics_work_outside_a_server(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO"):
        pb_utils.Logger.log_info("hello")
        pb_utils.Logger.log("warned", pb_utils.Logger.WARNING)
    assert "hello" in caplog.text and "warned" in caplog.text
    family = pb_utils.MetricFamily("n", "d", pb_utils.MetricFamily.COUNTER)
    metric = family.Metric(labels={"a": "b"})
    metric.increment(2)
    assert metric.value() == 2
    with pytest.raises(pb_utils.TritonModelException):
        metric.set(5)
