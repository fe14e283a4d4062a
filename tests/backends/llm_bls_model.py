"""A Python model (BLS) that streams llm_tiny's answer through `exec(decoupled=True)` and joins
the pieces: test_llm_backend.py serves it beside the language models."""

BLS_CONFIG = """
name: "llm_bls"
backend: "python"
max_batch_size: 0
input [ { name: "PROMPT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] },
         { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

# Streams llm_tiny's answer through BLS (exec(decoupled=True)) and joins the pieces.
BLS_MODEL = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            prompt = pb_utils.get_input_tensor_by_name(request, "PROMPT").as_numpy()
            params = json.dumps({"max_tokens": 12, "temperature": 0})
            inner = pb_utils.InferenceRequest(
                model_name="llm_tiny",
                requested_output_names=["text_output"],
                inputs=[
                    pb_utils.Tensor("text_input", prompt.astype(np.object_)),
                    pb_utils.Tensor("stream", np.array([True])),
                    pb_utils.Tensor("sampling_parameters", np.array([params.encode()], np.object_)),
                ],
            )
            pieces = []
            for response in inner.exec(decoupled=True):
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                out = pb_utils.get_output_tensor_by_name(response, "text_output")
                if out is not None:
                    pieces.append(out.as_numpy()[0].decode())
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("TEXT", np.array(["".join(pieces).encode()], np.object_)),
                        pb_utils.Tensor("COUNT", np.array([len(pieces)], np.int32)),
                    ]
                )
            )
        return responses
"""
