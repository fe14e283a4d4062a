"""A model.py run in the server's own process: Oceanus's opt-in `in_process` mode.

With the model parameter `oceanus_in_process` set to "true", the model's class is created and its
`initialize` / `execute` / `finalize` run on the server's instance threads: no stub, no rings, no
messages. pb_utils works as in a stub (tensors, responses, errors, logging, custom metrics, BLS
without decoupled streams); what needs a stub of its own is refused at load (decoupled models,
EXECUTION_ENV_PATH). The isolation given up is written in docs/python-backend.md: a crash, a hang
or a leak in the model is the server's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import itertools
import json
import os
import sys
import threading
import types
from collections.abc import Sequence
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from oceanus.backends.python import utils as pb
from oceanus.backends.python.batches import request_head
from oceanus.backends.python.model_args import initialize_args
from oceanus.backends.python.model_code import (
    AsyncRunner,
    check_returned,
    describe,
    format_exception,
    model_class,
)
from oceanus.backends.python.pb import runtime
from oceanus.backends.python.pb.types import ERROR_CODE_NAMES, ERROR_CODES_BY_NAME
from oceanus.backends.python.server_calls import BLS_CALLER, as_server_error
from oceanus.core.backend import (
    Arrays,
    LoadContext,
    RequestInstance,
    RequestJob,
    RequestsResult,
    ServerHandle,
)
from oceanus.core.errors import ErrorCode, InferenceServerError, internal, invalid_arg
from oceanus.core.observability.custom_metrics import CustomMetricRegistry, MetricOwner
from oceanus.core.repository.model_config import sequence_control_types
from oceanus.core.types import InferRequest, InferResponse, RequestedOutput, Tensor

PARAMETER = "oceanus_in_process"
_module_ids = itertools.count(1)
_FALLBACK_METRICS = CustomMetricRegistry()


def wanted(config: mc.ModelConfig) -> bool:
    value = config.parameters[PARAMETER].string_value if PARAMETER in config.parameters else ""
    if value.lower() in ("", "false", "0", "no", "off"):
        return False
    if value.lower() in ("true", "1", "yes", "on"):
        return True
    raise invalid_arg(f"model '{config.name}': parameter '{PARAMETER}' must be true or false")


class _Current(threading.local):
    instance: InProcessInstance | None = None


class InProcessRuntime(runtime.Runtime):
    """pb_utils' services in the server's process, for the instance running on this thread."""

    def __init__(self) -> None:
        self.current = _Current()
        self.owners: dict[tuple[str, int], MetricOwner] = {}  # what each id belongs to

    def _instance(self) -> InProcessInstance:
        instance = self.current.instance
        if instance is None:
            raise pb.TritonModelException(
                "in-process models use pb_utils' server calls only from initialize, execute "
                "and finalize"
            )
        return instance

    def _metric_owner(self) -> Any:
        instance = self.current.instance
        return instance.metrics if instance is not None else super()._metric_owner()

    def metric_call(self, operation: str, *args: Any) -> Any:
        result = super().metric_call(operation, *args)
        if operation in ("family_new", "metric_new"):
            # Deletions come from __del__ on whichever thread collects the object: they must
            # reach the owner that created it.
            self.owners[(operation[:-4], args[0])] = self._metric_owner()
        return result

    def metric_update(self, metric_id: int, operation: str, value: float) -> None:
        owner = self.owners.get(("metric", metric_id))
        (owner or self._metric_owner()).update(metric_id, operation, value)

    def metric_delete(self, what: str, number: int) -> None:
        owner = self.owners.pop((what, number), None)
        if owner is None:
            return
        if what == "family":
            owner.delete_family(number)
        else:
            owner.delete_metric(number)

    def bls(self, request: pb.InferenceRequest, decoupled: bool) -> Any:
        instance = self._instance()
        if decoupled:
            raise pb.TritonModelException(
                "decoupled BLS requests are not supported by in-process models"
            )
        if instance.server is None:
            raise pb.TritonModelException("BLS needs a running server")
        return instance.bls(instance.server, request)


_runtime = InProcessRuntime()


def _install_runtime() -> None:
    """pb_utils' runtime is one per process: in the server's, it is this one."""
    sys.modules.setdefault("triton_python_backend_utils", pb)
    if runtime.current() is not _runtime:
        runtime.install(_runtime)


def _load_module(model_path: str, model_name: str) -> types.ModuleType:
    """model.py under a name of its own (two in-process models both have a `model.py`), its
    folder on sys.path for its helper modules, as a stub puts it."""
    folder = os.path.dirname(model_path)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = f"_oceanus_in_process_{next(_module_ids)}_{model_name}"
    spec = importlib.util.spec_from_file_location(name, model_path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {model_path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class InProcessInstance(RequestInstance):
    """One instance of a model.py, run on the instance thread that calls it."""

    def __init__(self, context: LoadContext) -> None:
        config, spec = context.config, context.spec
        if config.model_transaction_policy.decoupled:
            raise invalid_arg(
                f"model '{config.name}': parameter '{PARAMETER}' does not support decoupled models"
            )
        if "EXECUTION_ENV_PATH" in config.parameters:
            raise invalid_arg(
                f"model '{config.name}': parameter '{PARAMETER}' runs the model on the server's "
                "interpreter; it cannot be combined with EXECUTION_ENV_PATH"
            )
        _install_runtime()
        self.name = spec.name
        self.model_name = config.name
        self.server: ServerHandle | None = context.server
        registry = self.server.custom_metrics if self.server is not None else _FALLBACK_METRICS
        self.metrics: MetricOwner = registry.owner()
        self._version = int(context.files.model_path.parent.name)
        self._input_types = {
            t.name: mc.DataType.Name(t.data_type)[5:].replace("STRING", "BYTES")
            for t in config.input
        }
        self._input_types.update(sequence_control_types(config))
        self._all_outputs = [t.name for t in config.output]
        self._state_outputs = [s.output_name for s in config.sequence_batching.state]
        self._runner = AsyncRunner()
        self._keys = itertools.count(1)
        model_path = str(context.files.model_path)
        args = initialize_args(context)
        try:
            with self._running():
                self._model = model_class(_load_module(model_path, config.name), model_path)()
                if not hasattr(self._model, "execute"):
                    raise AttributeError(
                        f"Python model {model_path} does not implement `execute` method."
                    )
                initialize = getattr(self._model, "initialize", None)
                if initialize is not None:
                    self._call(initialize, args)
        except BaseException as exc:
            self._runner.stop()
            self.metrics.close()
            raise internal(format_exception(exc)) from None

    def _running(self) -> _Running:
        return _Running(self)

    def _call(self, method: Any, *args: Any) -> Any:
        result = method(*args)
        if asyncio.iscoroutine(result):
            result = self._runner.run(self._as_this_instance(result)).result()
        return result

    async def _as_this_instance(self, coroutine: Any) -> Any:
        # The runner's loop thread serves this instance alone: pb_utils calls made from its
        # coroutines are this instance's.
        _runtime.current.instance = self
        return await coroutine

    def execute_requests(self, jobs: Sequence[RequestJob]) -> RequestsResult:
        requests = [self._request(job) for job in jobs]
        try:
            with self._running():
                returned = self._call(self._model.execute, requests)
                responses = check_returned(returned, requests, self.name, False)
        except BaseException as exc:
            raise internal(
                f"Failed to process the request(s) for model '{self.name}', message: "
                + describe(exc)
            ) from None
        if responses is None:
            raise internal(
                f"in-process model '{self.name}' must return its responses from execute "
                "(response senders need a stub)"
            )
        outputs: list[Arrays | InferenceServerError] = []
        parameters: list[dict[str, Any] | None] = []
        for request, response in zip(requests, responses, strict=True):
            error = response.error()
            if error is not None:
                code = ERROR_CODE_NAMES.get(error.code(), "INTERNAL")
                outputs.append(InferenceServerError(ErrorCode[code], error.message()))
                parameters.append(None)
                continue
            names = set(request.requested_output_names())
            outputs.append(
                {t.name(): t.as_numpy() for t in response.output_tensors() if t.name() in names}
            )
            parsed = json.loads(response.parameters() or "{}")
            parameters.append(parsed if isinstance(parsed, dict) and parsed else None)
        has_parameters = any(p is not None for p in parameters)
        return RequestsResult(outputs, parameters=parameters if has_parameters else None)

    def _request(self, job: RequestJob) -> pb.InferenceRequest:
        key, request_id, correlation, flags, timeout, parameters, names = request_head(
            next(self._keys), job.request, self._all_outputs, self._state_outputs
        )
        inputs = [
            pb.Tensor._wrap(name, self._input_types.get(name, ""), array)
            for name, array in job.inputs.items()
        ]
        return pb.InferenceRequest._received(
            key,
            request_id,
            correlation,
            flags,
            timeout,
            parameters,
            names,
            inputs,
            self.model_name,
            self._version,
            False,
        )

    def bls(
        self, server: ServerHandle, request: pb.InferenceRequest
    ) -> concurrent.futures.Future[Any]:
        """Run a BLS request through the core on the event loop; the future gets pb_utils'
        InferenceResponse (with `error()` set on failure), as a stub's BLS does."""
        answer: concurrent.futures.Future[Any] = concurrent.futures.Future()
        names = list(request.requested_output_names())
        parameters: dict[str, Any] = json.loads(request.parameters() or "{}")
        if request.correlation_id():
            parameters["sequence_id"] = request.correlation_id()
        flags = int(request.flags())
        if flags & 1:
            parameters["sequence_start"] = True
        if flags & 2:
            parameters["sequence_end"] = True
        if request.timeout():
            parameters["timeout"] = int(request.timeout())
        version = int(request.model_version())
        core_request = InferRequest(
            model_name=request.model_name(),
            model_version=str(version) if version >= 0 else "",
            id=request.request_id(),
            inputs=[
                Tensor(t.name(), t.datatype(), tuple(t.as_numpy().shape), t.as_numpy())
                for t in request.inputs()
            ],
            outputs=[RequestedOutput(n) for n in names] if names else None,
            parameters=parameters,
        )

        def failed(error: InferenceServerError) -> None:
            answer.set_result(
                pb.InferenceResponse(
                    error=pb.TritonError(error.message, ERROR_CODES_BY_NAME.get(error.code.name, 1))
                )
            )

        def done(future: asyncio.Future[InferResponse]) -> None:
            if future.cancelled():
                failed(internal("request cancelled"))
            elif future.exception() is not None:
                failed(as_server_error(future.exception() or Exception()))
            else:
                result = future.result()
                response = pb.InferenceResponse(
                    [pb.Tensor._wrap(t.name, t.datatype, t.data) for t in result.outputs]
                )
                simple = {
                    k: v for k, v in result.parameters.items() if isinstance(v, (bool, int, str))
                }
                response._parameters = json.dumps(simple)
                answer.set_result(response)

        def start() -> None:
            name, version_text = core_request.model_name, core_request.model_version
            try:
                if not server.model_serving(name, version_text):
                    raise internal(
                        f"Failed for execute the inference request. Model '{name}' is not ready."
                    )
                if server.is_decoupled(name, version_text):
                    raise internal(
                        f"Model {name} is using the decoupled. The current BLS request call "
                        "doesn't support models using the decoupled transaction policy."
                    )
                server.infer(core_request, caller=BLS_CALLER).add_done_callback(done)
            except InferenceServerError as exc:
                failed(internal(f"Model {name} - Error when running inference: {exc.message}"))

        server.loop.call_soon_threadsafe(start)
        return answer

    def close(self) -> None:
        finalize = getattr(self._model, "finalize", None)
        if finalize is not None:
            try:
                with self._running():
                    self._call(finalize)
            except BaseException as exc:
                pb.Logger.log_error(f"finalize failed: {format_exception(exc)}")
        self._runner.stop()
        self.metrics.close()


class _Running:
    """The model's code runs on this thread for this instance (pb_utils' runtime asks)."""

    def __init__(self, instance: InProcessInstance) -> None:
        self._instance = instance
        self._before: InProcessInstance | None = None

    def __enter__(self) -> None:
        self._before = _runtime.current.instance
        _runtime.current.instance = self._instance

    def __exit__(self, *exc: object) -> None:
        _runtime.current.instance = self._before
