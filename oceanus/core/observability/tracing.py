"""Request tracing with Triton's semantics: settings (global and per model), sampling, trace files.

A sampled request carries a `Trace`. Frontends note their own timestamps on it (HTTP_RECV_START,
GRPC_SEND_END, ...), the core notes the model's (REQUEST_START, QUEUE_START, COMPUTE_*, ...)
from the times it already keeps for statistics, and the frontend calls `finish()` once the
response is sent. Unsampled requests cost one attribute test: `TraceManager.sample` answers None
at once while no setting can sample.

Settings follow Triton's TraceManager (server src/tracer.cc): a global setting and optional
per-model settings; a model setting's unspecified fields follow the global setting, and clearing
every field of a model setting makes the model use the global one again. A setting is replaced,
never changed, so traces in flight finish under the setting that sampled them.

Output (mode "triton"): Triton's JSON trace format, written by one background thread so that
the event loop never waits on the disk. With log_frequency 0 the traces go to `trace_file` (a
JSON array closed at shutdown); otherwise every log_frequency traces go to `trace_file.<n>`.
When trace_count runs out, the collected traces go to `trace_file.<n>` at once.

Every method is called on the event loop.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import orjson

from oceanus.core.observability.trace_files import TraceFile, TraceWriter

log = logging.getLogger("oceanus.trace")

LEVEL_OFF = 0
LEVEL_TIMESTAMPS = 1
LEVEL_TENSORS = 2
LEVEL_NAMES = (("TIMESTAMPS", LEVEL_TIMESTAMPS), ("TENSORS", LEVEL_TENSORS))
MODE_TRITON = "triton"
MODE_OPENTELEMETRY = "opentelemetry"
MIN_COUNT = -1
UINT32_MAX = 2**32 - 1
INT32_MAX = 2**31 - 1


class TraceSettingError(Exception):
    """A trace setting request that cannot be applied; `code` is "INVALID_ARG" or
    "UNSUPPORTED" (frontends map it to their status)."""

    def __init__(self, message: str, code: str = "INVALID_ARG") -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def level_names(level: int) -> list[str]:
    if level == LEVEL_OFF:
        return ["OFF"]
    return [name for name, bit in LEVEL_NAMES if level & bit]


@dataclass
class TraceConfig:
    """What the command line set (`--trace-config`, and the deprecated `--trace-*` flags)."""

    level: int = LEVEL_OFF
    rate: int = 1000
    count: int = -1
    log_frequency: int = 0
    file: str = ""
    mode: str = MODE_TRITON
    # The mode's own settings, as given (opentelemetry: url, resource, bsp_*), in order.
    mode_options: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class SettingUpdate:
    """One trace setting request: a new value (not None), or `clear_*` to drop the field."""

    level: int | None = None
    rate: int | None = None
    count: int | None = None
    log_frequency: int | None = None
    clear_level: bool = False
    clear_rate: bool = False
    clear_count: bool = False
    clear_log_frequency: bool = False


class SpanExporter(Protocol):
    """Receives finished traces in mode "opentelemetry"
    (oceanus/core/observability/tracing_otel.py)."""

    def export(self, trace: Trace) -> None: ...

    def shutdown(self) -> None: ...


# ---- settings -----------------------------------------------------------------------------------


class TraceSetting:
    """One set of values (global, or one model's) and the traces sampled under it. An update
    makes a new setting; only the remaining count changes in place, as traces are taken."""

    def __init__(
        self,
        level: int,
        rate: int,
        count: int,
        log_frequency: int,
        file: TraceFile,
        mode: str,
        specified: frozenset[str] = frozenset(),
    ) -> None:
        self.level = level
        self.rate = rate
        self.count = count
        self.log_frequency = log_frequency
        self.file = file
        self.mode = mode
        self.specified = specified  # fields set for this setting rather than inherited
        self._sampled = 0  # requests seen
        self._created = 0  # traces sampled
        self._collected = 0  # traces finished
        self._pending: list[str] = []  # finished traces not yet saved
        self._retired = False
        if level == LEVEL_OFF:
            self.reason = "tracing is disabled"
        elif rate == 0:
            self.reason = "sample rate must be non-zero"
        elif mode == MODE_TRITON and not file.name:
            self.reason = "trace file name is not given"
        else:
            self.reason = ""

    @property
    def valid(self) -> bool:
        return not self.reason and self.count != 0

    def sample(self, force: bool = False) -> bool:
        """Whether this request is traced (every `rate`-th, while `count` lasts)."""
        hit = False
        if self.rate != 0:
            if not self.valid and not force:
                return False
            self._sampled += 1
            hit = self._sampled % self.rate == 0
            if hit and self.count > 0:
                self.count -= 1
                self._created += 1
            elif hit and self.count == 0:
                hit = False
        if hit or force:
            if not hit:
                self._created += 1
            return True
        return False

    def collect(self, text: str) -> None:
        """A finished trace (its JSON objects, comma-separated)."""
        self._pending.append(text)
        self._collected += 1
        if (
            self._retired
            or (self.count == 0 and self._collected >= self._created)
            or (self.log_frequency and len(self._pending) >= self.log_frequency)
        ):
            self.flush(indexed=not self._retired or self.log_frequency != 0)

    def flush(self, indexed: bool) -> None:
        if self._pending:
            text = ",".join(self._pending)
            self._pending = []
            self.file.save(text, indexed)

    def retire(self) -> None:
        """Replaced by a newer setting: save what it holds; later traces are saved at once."""
        self._retired = True
        self.flush(indexed=self.log_frequency != 0)


class TraceManager:
    """The server's trace settings and the traces they sample."""

    def __init__(self, config: TraceConfig, exporter: SpanExporter | None = None) -> None:
        self.mode = config.mode
        self.mode_options = list(config.mode_options)
        self._writer = TraceWriter()
        self._files: dict[str, TraceFile] = {}
        self._exporter = exporter
        self._ids = itertools.count(1)
        self._default = self._setting(
            config.level, config.rate, config.count, config.log_frequency, config.file
        )
        self._global = self._default
        self._models: dict[str, TraceSetting] = {}
        self._fallback_models: set[str] = set()
        self._active = False
        self._refresh()

    def _setting(
        self,
        level: int,
        rate: int,
        count: int,
        log_frequency: int,
        file: str,
        specified: frozenset[str] = frozenset(),
    ) -> TraceSetting:
        trace_file = self._files.get(file)
        if trace_file is None:
            trace_file = self._files[file] = TraceFile(file, self._writer)
        return TraceSetting(level, rate, count, log_frequency, trace_file, self.mode, specified)

    def _refresh(self) -> None:
        self._active = self._global.level != LEVEL_OFF or any(
            s.level != LEVEL_OFF for s in self._models.values()
        )

    @property
    def active(self) -> bool:
        """False while no setting traces anything: frontends then skip tracing altogether."""
        return self._active

    @property
    def propagates_context(self) -> bool:
        """Whether an incoming W3C `traceparent` forces a trace (OpenTelemetry mode)."""
        return self._active and self.mode == MODE_OPENTELEMETRY

    # ---- settings -------------------------------------------------------------------------

    def setting_of(self, model_name: str = "") -> TraceSetting:
        return self._models.get(model_name, self._global) if model_name else self._global

    def document(self, model_name: str = "") -> dict[str, str | list[str]]:
        """The settings as Triton's trace extension lists them (HTTP JSON / gRPC map)."""
        setting = self.setting_of(model_name)
        document: dict[str, str | list[str]] = {
            "trace_level": level_names(setting.level),
            "trace_rate": str(setting.rate),
            "trace_count": str(setting.count),
        }
        if self.mode == MODE_TRITON:
            document["log_frequency"] = str(setting.log_frequency)
            document["trace_file"] = setting.file.name
        document["trace_mode"] = self.mode
        for key, value in self.mode_options:
            if key not in ("file", "log-frequency"):
                document[key] = value
        return document

    def update(self, model_name: str, update: SettingUpdate) -> None:
        """Apply a trace setting request (Triton's UpdateTraceSetting); raises
        TraceSettingError when the result would be an invalid setting that still traces."""
        self._update_one(model_name, update)
        if not model_name:  # models that follow the global setting in part follow it now
            for name in list(self._fallback_models):
                self._update_one(name, SettingUpdate())
        self._refresh()

    def _update_one(self, model_name: str, update: SettingUpdate) -> None:
        current = self._models.get(model_name) if model_name else self._global
        fallback = self._global if model_name else self._default
        values = {
            "level": fallback.level,
            "rate": fallback.rate,
            "count": fallback.count,
            "log_frequency": fallback.log_frequency,
        }
        specified = set()
        for key in values:
            new = getattr(update, key)
            cleared = getattr(update, "clear_" + key)
            if cleared:
                continue
            if new is not None:
                values[key] = new
                specified.add(key)
            elif current is not None and key in current.specified:
                values[key] = getattr(current, key)
                specified.add(key)
        if model_name:
            if not specified:  # nothing of its own: the model follows the global setting
                old = self._models.pop(model_name, None)
                self._fallback_models.discard(model_name)
                if old is not None:
                    old.retire()
                return
            # The file is never a model's own, so every model setting follows the global one.
            self._fallback_models.add(model_name)
        setting = self._setting(
            values["level"],
            values["rate"],
            values["count"],
            values["log_frequency"],
            fallback.file.name,
            frozenset(specified),
        )
        if not setting.valid and setting.level != LEVEL_OFF:
            # Triton gives no reason for a count of 0 (it reads "...setting :"); Oceanus says it.
            reason = setting.reason or "trace count is 0"
            raise TraceSettingError("Attempting to set invalid trace setting :" + reason)
        if model_name:
            self._models[model_name] = setting
        else:
            self._global = setting
        if current is not None:
            current.retire()

    # ---- tracing --------------------------------------------------------------------------

    def sample(self, model_name: str, traceparent: str | None = None) -> Trace | None:
        """A Trace if this request to `model_name` is traced, else None (the fast path)."""
        if not self._active:
            return None
        setting = self.setting_of(model_name)
        force = traceparent is not None and self.mode == MODE_OPENTELEMETRY
        if setting.level == LEVEL_OFF or not setting.sample(force):
            return None
        return Trace(next(self._ids), setting, self, traceparent if force else None)

    def _finished(self, trace: Trace) -> None:
        if trace.setting.mode == MODE_OPENTELEMETRY:
            if self._exporter is not None:
                self._exporter.export(trace)
            return
        trace.setting.collect(trace.to_json())

    def close(self) -> None:
        """At shutdown: save what every setting holds, close the files, stop the writer."""
        for setting in {self._global, *self._models.values()}:
            setting.flush(indexed=setting.log_frequency != 0)
        for trace_file in self._files.values():
            trace_file.close()
        self._writer.close()
        if self._exporter is not None:
            self._exporter.shutdown()


# ---- one trace ----------------------------------------------------------------------------------


@dataclass(slots=True)
class ModelActivity:
    """What one model did for a traced request."""

    model_name: str
    model_version: int
    request_id: str
    timestamps: list[tuple[str, int]]
    tensors: list[tuple[str, str, np.ndarray, str]]  # (activity, name, array, datatype)


class Trace:
    """One traced request: frontend timestamps, and the activity of the model it reached."""

    __slots__ = ("_manager", "_models", "finished", "id", "setting", "timestamps", "traceparent")

    def __init__(
        self, trace_id: int, setting: TraceSetting, manager: TraceManager, traceparent: str | None
    ) -> None:
        self.id = trace_id
        self.setting = setting
        self.traceparent = traceparent
        self.timestamps: list[tuple[str, int]] = []  # the frontend's own
        self._models: list[ModelActivity] = []
        self._manager = manager
        self.finished = False

    @property
    def models(self) -> list[ModelActivity]:
        return self._models

    @property
    def wants_tensors(self) -> bool:
        return bool(self.setting.level & LEVEL_TENSORS)

    def capture(self, name: str, ns: int) -> None:
        self.timestamps.append((name, ns))

    def record_model(self, activity: ModelActivity) -> None:
        self._models.append(activity)

    def finish(self) -> None:
        """The response is sent (or the request ended): write or export the trace once."""
        if self.finished:
            return
        self.finished = True
        self._manager._finished(self)

    def to_json(self) -> str:
        """Triton's trace file objects for this trace, comma-separated (no brackets)."""
        objects: list[dict[str, Any]] = []
        timestamps = self.setting.level & LEVEL_TIMESTAMPS
        # Frontend timestamps taken before the model saw the request come first, as in Triton.
        front = sorted(self.timestamps, key=_ns)
        start = min((m.timestamps[0][1] for m in self._models if m.timestamps), default=None)
        before = [t for t in front if start is None or t[1] <= start]
        after = front[len(before) :]
        if timestamps:
            objects += [self._timestamp(name, ns) for name, ns in before]
        for model in self._models:
            header: dict[str, Any] = {
                "id": self.id,
                "model_name": model.model_name,
                "model_version": model.model_version,
            }
            if model.request_id:
                header["request_id"] = model.request_id
            objects.append(header)
            if timestamps:
                objects += [self._timestamp(name, ns) for name, ns in model.timestamps]
            for activity, name, array, datatype in model.tensors:
                tensor = _tensor(name, array, datatype)
                objects.append({"id": self.id, "activity": activity, "tensor": tensor})
        if timestamps:
            objects += [self._timestamp(name, ns) for name, ns in after]
        return ",".join(orjson.dumps(o).decode() for o in objects)

    def _timestamp(self, name: str, ns: int) -> dict[str, Any]:
        return {"id": self.id, "timestamps": [{"name": name, "ns": ns}]}


def _ns(item: tuple[str, int]) -> int:
    return item[1]


def _tensor(name: str, array: np.ndarray, datatype: str) -> dict[str, str]:
    flat = array.reshape(-1)
    if array.dtype == np.object_:
        values = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in flat]
    else:
        values = [str(v) for v in flat.tolist()]
    return {
        "name": name,
        "data": ",".join(values),
        "shape": ",".join(str(d) for d in array.shape),
        "dtype": datatype,
    }
