"""The model loading API from execute(): ACTION "ready" | "ready_bad_version" | "load" |
"load_config" | "load_files" | "unload" on model NAME; OK is the readiness (or True), ERROR the
text of the TritonModelException raised (empty when none)."""

import json

import numpy as np

import triton_python_backend_utils as pb_utils

# A model made only of the files a load sends: Y = X * 2.
DOUBLE_PY = b"""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 2)]
            )
            for r in requests
        ]
"""
DOUBLE_CONFIG = {
    "backend": "python",
    "max_batch_size": 0,
    "input": [{"name": "X", "data_type": "TYPE_INT32", "dims": [1]}],
    "output": [{"name": "Y", "data_type": "TYPE_INT32", "dims": [1]}],
}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            action = pb_utils.get_input_tensor_by_name(request, "ACTION").as_numpy()[0].decode()
            name = pb_utils.get_input_tensor_by_name(request, "NAME").as_numpy()[0].decode()
            ok, error = True, ""
            try:
                if action == "ready":
                    ok = pb_utils.is_model_ready(name)
                elif action == "ready_bad_version":
                    ok = pb_utils.is_model_ready(name, "abc")
                elif action == "load":
                    pb_utils.load_model(name)
                elif action == "load_config":
                    # add_sub's config with two instances: an override replaces the whole
                    # config.pbtxt, as in Triton
                    tensors = [{"data_type": "TYPE_FP32", "dims": [4]}] * 2
                    config = {
                        "backend": "python",
                        "max_batch_size": 8,
                        "input": [{"name": f"INPUT{i}", **t} for i, t in enumerate(tensors)],
                        "output": [{"name": f"OUTPUT{i}", **t} for i, t in enumerate(tensors)],
                        "instance_group": [{"count": 2, "kind": "KIND_CPU"}],
                    }
                    pb_utils.load_model(model_name=name, config=json.dumps(config))
                elif action == "load_files":
                    pb_utils.load_model(
                        name,
                        config=json.dumps({**DOUBLE_CONFIG, "name": name}),
                        files={"file:1/model.py": DOUBLE_PY},
                    )
                elif action == "unload":
                    pb_utils.unload_model(name, unload_dependents=False)
                    ok = pb_utils.is_model_ready(name)
            except pb_utils.TritonModelException as exc:
                ok, error = False, exc.message()
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("OK", np.array([ok], dtype=np.bool_)),
                        pb_utils.Tensor("ERROR", np.array([error.encode()], dtype=np.object_)),
                    ]
                )
            )
        return responses
