"""--backend-config=python,...: Triton's shared-memory sizes and stub timeout on our rings.

The files a message makes when it does not fit a ring (a one-off file, or the ring's new, larger
segment) are unlinked as soon as they are mapped; inotify counts them (oceanus/ipc/shm_watch.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from oceanus.backends.python import options
from oceanus.core.errors import InferenceServerError
from oceanus.ipc.rings import shm_dir
from oceanus.ipc.shm_watch import ShmWatch

MODEL_PY = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
            for r in requests]
"""
ELEMENTS = 1 << 20  # a 4 MiB FP32 tensor
CONFIG = f"""backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ {ELEMENTS} ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ {ELEMENTS} ] }} ]
"""


def test_settings_of_the_python_backend_only() -> None:
    flags = [
        "python,shm-default-byte-size=1048576",
        "onnxruntime,x=1",
        "python,stub-timeout-seconds=9",
    ]
    settings = options.backend_settings(flags, "python")
    assert settings == {"shm-default-byte-size": "1048576", "stub-timeout-seconds": "9"}
    parsed = options.parse(settings)
    # The stub's two rings share the region's size, as Triton's one region would take it.
    assert (parsed.shm_bytes, parsed.ring_bytes, parsed.stub_timeout_s) == (1 << 20, 1 << 19, 9.0)
    unset = options.parse({})  # Triton's defaults: 1 MiB at start, growing by 1 MiB
    assert (unset.shm_bytes, unset.growth_bytes) == (1 << 20, 1 << 20)
    assert options.parse({"shm-growth-byte-size": "0"}).growth_bytes == 0


@pytest.mark.parametrize(
    ("key", "value", "minimum"),
    [
        ("shm-default-byte-size", "1k", 65536),
        ("shm-default-byte-size", "4096", 65536),
        ("shm-growth-byte-size", "-1", 0),
        ("stub-timeout-seconds", "0", 1),
    ],
)
def test_bad_values_are_refused(key: str, value: str, minimum: int) -> None:
    with pytest.raises(InferenceServerError) as refused:
        options.parse({key: value})
    assert str(refused.value) == (
        f"--backend-config=python,{key}={value}: expected an integer >= {minimum}"
    )


def files_made(launch: Any, repository: Path, settings: list[str], requests: int) -> int:
    server = launch([repository], [f"--backend-config=python,{kv}" for kv in settings])
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    tensor = httpclient.InferInput("IN", [ELEMENTS], "FP32")
    data = np.arange(ELEMENTS, dtype=np.float32)
    tensor.set_data_from_numpy(data)
    watch = ShmWatch(shm_dir())
    try:
        for _ in range(requests):
            assert np.array_equal(client.infer("big", [tensor]).as_numpy("OUT"), data)
        prefix = f"oceanus-py-{server.process.pid}-"
        return sum(name.startswith(prefix) for name in watch.created())
    finally:
        watch.close()


def test_rings_grow_once_for_large_tensors(launch: Any, tmp_path: Path) -> None:
    (tmp_path / "big" / "1").mkdir(parents=True)
    (tmp_path / "big" / "1" / "model.py").write_text(MODEL_PY)
    (tmp_path / "big" / "config.pbtxt").write_text(CONFIG)
    # Triton's defaults (1 MiB for both rings, 1 MiB steps): the first request grows each ring
    # once (one new segment per direction), then every 4 MiB tensor fits.
    assert files_made(launch, tmp_path, [], 5) == 2
    # Without growth each request's input and output take one-off files.
    assert files_made(launch, tmp_path, ["shm-growth-byte-size=0"], 5) == 10
    # Rings sized for the tensors from the start: nothing at all.
    assert files_made(launch, tmp_path, ["shm-default-byte-size=33554432"], 5) == 0
