"""INT32 INPUT0 + INPUT1 and INPUT0 - INPUT1 over a variable dimension (never run by its test:
the requests it gets are refused)."""

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            outputs = [
                pb_utils.Tensor("OUTPUT0", (a + b).astype(np.int32)),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(np.int32)),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
