"""What only a stub process can do for pb_utils (the server's log, BLS, response senders,
custom metrics, model control), behind one object the stub installs; and the pb_utils calls
that go through it: logging and the model loading API.

Outside a stub (a model.py's own unit tests) the default Runtime answers what it can locally.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from oceanus.backends.python.pb.types import TritonModelException

if TYPE_CHECKING:
    from oceanus.backends.python.pb.requests import InferenceRequest, InferenceResponse


class Runtime:
    """What only the stub process can do; the stub installs a subclass."""

    model_name = ""

    def send_response(self, key: int, response: InferenceResponse | None, flags: int) -> None:
        raise TritonModelException("response senders work only inside a running model")

    def is_cancelled(self, key: int) -> bool:
        return False

    def bls(self, request: InferenceRequest, decoupled: bool) -> Any:
        raise TritonModelException("BLS requests work only inside a running model")

    def log(self, level: str, message: str) -> None:
        logging.getLogger("triton_python_backend_utils").log(
            {"INFO": logging.INFO, "WARNING": logging.WARNING, "ERROR": logging.ERROR}.get(
                level, logging.DEBUG
            ),
            message,
        )

    def server_call(self, operation: str, *args: Any) -> Any:
        """Ask the server (model readiness, load, unload) and wait for its answer; raises
        TritonModelException with the server's error."""
        if operation == "model_ready":
            return False
        raise TritonModelException(f"pb_utils.{operation} works only inside a running model")

    # Custom metrics: outside a stub they live in this process.
    _metrics: Any = None

    def _metric_owner(self) -> Any:
        if self._metrics is None:
            from oceanus.core.observability.custom_metrics import CustomMetricRegistry

            self._metrics = CustomMetricRegistry().owner()
        return self._metrics

    def metric_call(self, operation: str, *args: Any) -> Any:
        """family_new / metric_new / metric_value: answered; raises TritonModelException."""
        from oceanus.core.observability.custom_metrics import MetricError

        owner = self._metric_owner()
        try:
            if operation == "family_new":
                return owner.new_family(*args)
            if operation == "metric_new":
                return owner.new_metric(*args)
            return owner.value(*args)
        except MetricError as exc:
            raise TritonModelException(str(exc)) from None

    def metric_update(self, metric_id: int, operation: str, value: float) -> None:
        self._metric_owner().update(metric_id, operation, value)

    def metric_delete(self, what: str, number: int) -> None:
        owner = self._metric_owner()
        if what == "family":
            owner.delete_family(number)
        else:
            owner.delete_metric(number)

    def wait(self, done: Any) -> None:
        """Block until done() (the stub reads its messages meanwhile)."""

    def poke(self) -> None:
        """Something a waiter may be waiting for happened."""


_current = Runtime()


def current() -> Runtime:
    """The runtime in use: the stub's, once it installed it."""
    return _current


def install(runtime: Runtime) -> None:
    global _current
    _current = runtime


# ---- model loading API ---------------------------------------------------------------------------


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether the server reports the model (version) ready, as its ready endpoint does."""
    if model_version:
        try:
            number = int(model_version)
        except ValueError:
            raise TritonModelException(
                "Failed to check model readiness: failed to get model version from specified "
                f"version string '{model_version}' (details: stol), version should be an "
                "integral value > 0"
            ) from None
        if number < 0:
            raise TritonModelException(
                "Failed to check model readiness: failed to get model version from specified "
                f"version string '{model_version}', version should be an integral value > 0"
            )
    return bool(current().server_call("model_ready", model_name, model_version))


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) a model, as the repository extension's load does: only when the server
    runs with `--model-control-mode=explicit`. `config`: a config override in JSON; `files`:
    {"file:<version>/<name>": bytes} forming the model's folder (needs `config`)."""
    if files is not None and not isinstance(files, dict):
        raise TritonModelException(
            f"failed to load model '{model_name}', files should be a dictionary of file paths "
            "and file contents"
        )
    contents = {str(k): bytes(v) for k, v in (files or {}).items()}
    try:
        current().server_call("load_model", model_name, config or "", contents)
    except TritonModelException as exc:
        raise TritonModelException(f"Failed to load model: {exc.message()}") from None


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload a model (explicit model control mode only). Returns once it is unloaded."""
    try:
        current().server_call("unload_model", model_name, bool(unload_dependents))
    except TritonModelException as exc:
        raise TritonModelException(f"Failed to unload model: {exc.message()}") from None


# ---- logging ------------------------------------------------------------------------------------


class Logger:
    """Writes to the server's log: `pb_utils.Logger.log_info("...")`."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3
    _LEVELS = {0: "INFO", 1: "WARNING", 2: "ERROR", 3: "VERBOSE"}

    @staticmethod
    def log(message: str, level: int = 0) -> None:
        current().log(Logger._LEVELS.get(level, "INFO"), str(message))

    @staticmethod
    def log_info(message: str) -> None:
        current().log("INFO", str(message))

    @staticmethod
    def log_warn(message: str) -> None:
        current().log("WARNING", str(message))

    @staticmethod
    def log_error(message: str) -> None:
        current().log("ERROR", str(message))

    @staticmethod
    def log_verbose(message: str) -> None:
        current().log("VERBOSE", str(message))
