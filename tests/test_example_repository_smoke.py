"""The README's first command: the server with no --model-repository serves the built-in example
repository, including the two big models (one smoke inference each)."""

from __future__ import annotations

from typing import Any

import numpy as np
import tritonclient.http as httpclient


def test_default_repository_serves_resnet50_and_text_classifier(launch: Any) -> None:
    server = launch([], ["--allow-grpc=false", "--allow-metrics=false"])
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    assert client.is_model_ready("resnet50_onnx")
    assert client.is_model_ready("text_classifier_onnx")

    image = httpclient.InferInput("input", [1, 3, 224, 224], "FP32")
    image.set_data_from_numpy(np.random.default_rng(0).random((1, 3, 224, 224), np.float32))
    result = client.infer(
        "resnet50_onnx", [image], outputs=[httpclient.InferRequestedOutput("output")]
    )
    scores = result.as_numpy("output")
    assert scores.shape == (1, 1000)
    assert np.isfinite(scores).all()

    ids = np.random.default_rng(1).integers(0, 1000, size=(2, 128), dtype=np.int64)
    mask = np.ones((2, 128), dtype=np.int64)
    inputs = []
    for name, value in (("input_ids", ids), ("attention_mask", mask)):
        tensor = httpclient.InferInput(name, [2, 128], "INT64")
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    probabilities = client.infer("text_classifier_onnx", inputs).as_numpy("probabilities")
    assert probabilities.shape == (2, 2)
    assert np.allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)

    config = client.get_model_config("resnet50_onnx")
    assert config["dynamic_batching"]["preferred_batch_size"] == [8, 16, 32, 64]
    # The examples ask for no kind (KIND_AUTO): the CPU here, as Triton would choose it, so a
    # machine without a GPU has nothing to warn about (issue 19).
    kind = "KIND_GPU" if _gpus() else "KIND_CPU"
    assert config["instance_group"][0]["kind"] == kind
    log = server.log()
    assert "no GPU is available" not in log
    assert not [line for line in log.splitlines() if line.startswith("W")], log


def _gpus() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:
        return 0
