"""Where batches execute (core/instance.py): a cheap model's batches move onto the event loop,
a slow model's stay on its instance threads. Observed through a real server's verbose log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http as httpclient

ON_LOOP = "on the event loop"


def infer(client: httpclient.InferenceServerClient, model: str, datatype: str, n: int) -> None:
    dtype = np.int32 if datatype == "INT32" else np.float32
    names = ("INPUT0", "INPUT1") if model.startswith("simple") else ("INPUT0",)
    inputs = []
    for name in names:
        tensor = httpclient.InferInput(name, [1, 16], datatype)
        tensor.set_data_from_numpy(np.arange(16, dtype=dtype).reshape(1, 16))
        inputs.append(tensor)
    result = client.infer(model, inputs)
    if model.startswith("simple"):  # the answer is right wherever the batch ran
        assert (result.as_numpy("OUTPUT0") == 2 * np.arange(16)).all(), n


def test_cheap_batches_run_on_the_loop_slow_ones_on_threads(
    launch: Any, model_repository: Path
) -> None:
    server = launch([model_repository], ["--log-verbose=1", "--allow-grpc=false"])
    with httpclient.InferenceServerClient(server.http_url) as client:
        for n in range(60):
            infer(client, "simple", "INT32", n)
        for n in range(3):
            infer(client, "slow_fp32", "FP32", n)
    lines = server.log().splitlines()
    simple = [line for line in lines if "executed a batch of 1 for 'simple'" in line]
    slow = [line for line in lines if "executed a batch of 1 for 'slow_fp32'" in line]
    assert len(simple) == 60 and len(slow) == 3
    # The first two batches run on the thread (warm-up, then the first measurement); once
    # measured as cheap, batches run on the loop. Wall time decides: on a loaded machine a
    # preempted execution looks slow and sends a few batches back to the thread (the safe
    # direction), hence only "some".
    assert ON_LOOP not in simple[0] and ON_LOOP not in simple[1]
    assert sum(ON_LOOP in line for line in simple[10:]) >= 10
    assert not any(ON_LOOP in line for line in slow)


def test_lone_requests_of_unbatched_cheap_models_execute_in_place(
    launch: Any, model_repository: Path
) -> None:
    """`simple` has no dynamic batching: once it runs on the loop, a request that finds nothing
    queued executes inside enqueue. `simple_dyna` batches, so its requests always queue (others
    read in the same loop iteration may still join the batch)."""
    server = launch([model_repository], ["--log-verbose=1", "--allow-grpc=false"])
    with httpclient.InferenceServerClient(server.http_url) as client:
        for n in range(40):
            infer(client, "simple", "INT32", n)
            infer(client, "simple_dyna", "INT32", n)
    lines = server.log().splitlines()
    in_place = [line for line in lines if "executes in place" in line]
    on_loop = [line for line in lines if "for 'simple' in" in line and ON_LOOP in line]
    # Sequential requests always find the queue empty: every batch of `simple` that ran on the
    # loop ran in place (how many ran on the loop depends on the machine's load: see above).
    assert on_loop and len([line for line in in_place if "for 'simple'" in line]) == len(on_loop)
    assert not [line for line in in_place if "for 'simple_dyna'" in line]
    queued = [line for line in lines if "for 'simple_dyna' queued" in line]
    assert len(queued) == 40
