"""X < 0: that request gets an error response; X == 13: execute raises (all requests fail);
X == 7: the model returns the wrong number of responses."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        values = [int(pb_utils.get_input_tensor_by_name(r, "X").as_numpy()[0][0]) for r in requests]
        if 13 in values:
            raise ValueError("exception raised in execute")
        if 7 in values:
            return []
        responses = []
        for request, value in zip(requests, values, strict=False):
            if value == -2:
                error = pb_utils.TritonError("not found here", pb_utils.TritonError.NOT_FOUND)
                responses.append(pb_utils.InferenceResponse(error=error))
            elif value < 0:
                responses.append(
                    pb_utils.InferenceResponse(
                        error=pb_utils.TritonError("custom failure from model")
                    )
                )
            else:
                x = pb_utils.get_input_tensor_by_name(request, "X")
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x.as_numpy())]))
        return responses
