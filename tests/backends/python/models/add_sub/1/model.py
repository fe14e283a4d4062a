"""INPUT0 + INPUT1 and INPUT0 - INPUT1, written as for Triton's Python backend."""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = dict(args)
        config = json.loads(args["model_config"])
        self.output_dtype = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(config, "OUTPUT0")["data_type"]
        )
        pb_utils.Logger.log_info(f"add_sub initialized as {args['model_instance_name']}")

    def execute(self, requests):
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            outputs = [
                pb_utils.Tensor("OUTPUT0", (in0 + in1).astype(self.output_dtype)),
                pb_utils.Tensor("OUTPUT1", (in0 - in1).astype(self.output_dtype)),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
