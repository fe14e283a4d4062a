"""ONNX Runtime's auto-complete, in process (the real backend behind a ServerCore, no server
process): a folder holding only `1/model.onnx` loads with a config completed from the file."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import numpy as np

from oceanus.backends import builtin
from oceanus.core.server import CoreOptions, ServerCore
from oceanus.core.types import InferRequest, Tensor


def test_a_config_less_onnx_model_is_completed_from_its_file(
    tmp_path: Path, model_repository: Path
) -> None:
    (tmp_path / "simple" / "1").mkdir(parents=True)
    shutil.copy(model_repository / "simple" / "1" / "model.onnx", tmp_path / "simple" / "1")

    async def scenario() -> None:
        core = ServerCore(CoreOptions([tmp_path], backends=builtin.registry(entry_points=False)))
        await core.start()
        try:
            config = core.model_config("simple")
            assert (config.backend, config.platform) == ("onnxruntime", "onnxruntime_onnx")
            assert config.max_batch_size == 4  # all dims dynamic in front: Triton's default
            assert config.HasField("dynamic_batching")
            assert [(i.name, list(i.dims)) for i in config.input] == [
                ("INPUT0", [16]),
                ("INPUT1", [16]),
            ]
            assert [o.name for o in config.output] == ["OUTPUT0", "OUTPUT1"]
            assert core.model_metadata("simple")["platform"] == "onnxruntime_onnx"
            data = np.arange(16, dtype=np.int32).reshape(1, 16)
            inputs = [Tensor(name, "INT32", (1, 16), data) for name in ("INPUT0", "INPUT1")]
            response = await core.infer(InferRequest("simple", inputs=inputs), "test")
            assert np.array_equal(response.outputs[0].data, data * 2)
        finally:
            await core.shutdown()

    asyncio.run(scenario())
