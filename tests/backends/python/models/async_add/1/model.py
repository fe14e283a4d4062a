"""async def execute: Y = X + 1 after awaiting. (initialize stays a plain def: Triton 2.51 never
awaits an async initialize.)"""

import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.step = 1

    async def execute(self, requests):
        await asyncio.sleep(0.001)
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + self.step)]))
        return responses
