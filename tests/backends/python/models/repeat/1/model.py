"""Decoupled: N responses I = 0..N-1 (response parameter "index": I) from a thread, then the
final flag alone; N < 0: an error."""

import threading

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = __import__("json").loads(args["model_config"])
        assert pb_utils.using_decoupled_model_transaction_policy(config)

    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            threading.Thread(target=self._respond, args=(request.get_response_sender(), n)).start()
        return None

    def _respond(self, sender, n):
        if n < 0:
            error = pb_utils.TritonError("negative count", pb_utils.TritonError.INVALID_ARG)
            sender.send(
                pb_utils.InferenceResponse(error=error),
                pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
            return
        for i in range(n):
            sender.send(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("I", np.array([i], dtype=np.int32))],
                    parameters={"index": i},
                )
            )
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
