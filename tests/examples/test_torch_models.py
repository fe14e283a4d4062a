"""The TorchScript example models (oceanus/examples/torch_models.py)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

torch = pytest.importorskip("torch")

from oceanus.examples import repository, resnet, torch_models  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")


def test_resnet50_pytorch_computes_what_resnet50_onnx_does() -> None:
    images = np.random.default_rng(50).standard_normal((2, 3, 224, 224)).astype(np.float32)
    session = ort.InferenceSession(
        resnet.build().SerializeToString(), providers=["CPUExecutionProvider"]
    )
    expected = session.run(None, {"input": images})[0]
    module = torch_models.build_resnet50()
    with torch.inference_mode():
        scores = module(torch.from_numpy(images)).numpy()
    assert scores.shape == (2, 1000)
    np.testing.assert_allclose(scores, expected, rtol=1e-4, atol=1e-4)
    assert not np.allclose(scores[0], scores[1])


def test_resnet50_pytorch_is_optional_but_not_default() -> None:
    assert "resnet50_pytorch" in repository.OPTIONAL_MODELS
    assert "resnet50_pytorch" not in repository.default_models()
    assert "max_batch_size: 8" in torch_models.RESNET50_CONFIG
    assert 'name: "resnet50_pytorch"' in torch_models.RESNET50_CONFIG
