"""The input as scores in four datatypes (FP32, INT32 x10, FP16, BYTES): the classification
extension's test model (tests/frontends/grpc/test_grpc_reference.py), the same model.py that
was recorded against Triton 2.51."""

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            scores = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            rows = scores.reshape(scores.shape[0], -1)
            text = np.array([[str(x).encode() for x in row] for row in rows], dtype=object)
            outputs = [
                pb_utils.Tensor("OUTPUT0", scores.astype(np.float32)),
                pb_utils.Tensor("OUTPUT1", (scores * 10).astype(np.int32)),
                pb_utils.Tensor("OUTPUT2", scores.astype(np.float16)),
                pb_utils.Tensor("OUTPUT3", text.reshape(scores.shape)),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
