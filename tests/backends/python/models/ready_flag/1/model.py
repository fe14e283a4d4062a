"""A user-defined is_ready(): ready unless the file `flag` beside config.pbtxt exists; its
content picks how: "false" (returns False), "raise" (raises), "int" (returns 1, not a bool).
Y = X, whatever the readiness."""

import asyncio
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.flag = os.path.join(args["model_repository"], "flag")

    async def is_ready(self):
        await asyncio.sleep(0)
        if not os.path.exists(self.flag):
            return True
        with open(self.flag) as file:
            how = file.read().strip()
        if how == "raise":
            raise RuntimeError("dependency is down")
        if how == "int":
            return 1
        return False

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]
            )
            for r in requests
        ]
