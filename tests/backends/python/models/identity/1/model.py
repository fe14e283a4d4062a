"""Every IN_<T> comes back as OUT_<T>; the request's parameters come back in INFO."""

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = []
            for tensor in request.inputs():
                array = tensor.as_numpy()
                if tensor.name() == "IN_BYTES":
                    assert array.dtype == np.object_
                    assert all(isinstance(item, bytes) for item in array.reshape(-1))
                outputs.append(pb_utils.Tensor(tensor.name().replace("IN_", "OUT_"), array))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
