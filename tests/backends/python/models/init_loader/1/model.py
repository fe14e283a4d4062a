"""Loads the model its config names (parameter "load_on_init") from initialize(); RESULT says
how that went: "loaded", or the error text (the model loads either way)."""

import json

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        name = config["parameters"]["load_on_init"]["string_value"]
        try:
            pb_utils.load_model(name)
            self.result = "loaded" if pb_utils.is_model_ready(name) else "not ready"
        except pb_utils.TritonModelException as exc:
            self.result = exc.message()

    def execute(self, requests):
        result = np.array([self.result.encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("RESULT", result)]) for _ in requests]
