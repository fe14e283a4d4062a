"""X = 0: Y = the worker's pid; 1: os._exit; 2: sleep past the execute timeout; 3: SIGSEGV;
4: mark the version folder (`executing`) and sleep 60 s, for a kill from outside; otherwise
Y = X."""

import ctypes
import os
import time

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = int(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
            if x == 0:
                x = os.getpid()
            elif x == 1:
                os._exit(3)
            elif x == 2:
                time.sleep(30)
            elif x == 3:
                ctypes.string_at(0)
            elif x == 4:
                marker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "executing")
                open(marker, "w").close()
                time.sleep(60)
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([x], dtype=np.int64))])
            )
        return responses
