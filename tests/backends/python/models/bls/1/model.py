"""BLS: SUM = add_sub(A, A).OUTPUT0 through exec() ("sync"), async_exec() ("async"), a model
that does not exist ("missing": the error text comes back as SUM's error) or the decoupled
model repeat ("stream": COUNT = number of responses, the empty final one included)."""

import asyncio

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
            model = "no_such_model" if mode == "missing" else "add_sub"
            inner = pb_utils.InferenceRequest(
                model_name=model,
                requested_output_names=["OUTPUT0"],
                inputs=[
                    pb_utils.Tensor("INPUT0", a.reshape(1, 4)),
                    pb_utils.Tensor("INPUT1", a.reshape(1, 4)),
                ],
            )
            count = np.array([0], dtype=np.int32)
            if mode == "stream":
                stream = pb_utils.InferenceRequest(
                    model_name="repeat",
                    requested_output_names=["I"],
                    inputs=[pb_utils.Tensor("N", np.array([3], dtype=np.int32))],
                )
                got = [r for r in stream.exec(decoupled=True)]
                count[0] = len(got)
            if mode == "async":
                results = await asyncio.gather(inner.async_exec(), inner.async_exec())
                response = results[0]
            else:
                response = inner.exec()
            if response.has_error():
                responses.append(pb_utils.InferenceResponse(error=response.error()))
                continue
            total = pb_utils.get_output_tensor_by_name(response, "OUTPUT0").as_numpy().reshape(4)
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("SUM", total), pb_utils.Tensor("COUNT", count)]
                )
            )
        return responses
