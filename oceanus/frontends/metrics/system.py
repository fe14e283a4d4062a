"""Machine gauges for Prometheus: CPU use and memory from /proc, NVIDIA GPUs through NVML.

A `SystemMetrics` polls on its own daemon thread every `--metrics-interval-ms` and keeps the latest
`SystemSnapshot`; a scrape only reads that snapshot (one attribute read), never /proc or NVML.
NVML comes from the optional `nvidia-ml-py` package (`import pynvml`); without it, or without an
NVIDIA GPU, `gpus` stays empty and the GPU families are not exported at all.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("oceanus.metrics")

# /proc/stat "cpu" columns: user nice system idle iowait irq softirq steal (guest time is
# already inside user/nice).
_IDLE_COLUMNS = (3, 4)


@dataclass(frozen=True)
class GpuSample:
    uuid: str
    utilization: float  # 0.0 - 1.0
    memory_total_bytes: int
    memory_used_bytes: int
    power_usage_w: float
    power_limit_w: float
    energy_j: float  # since the server started


@dataclass(frozen=True)
class SystemSnapshot:
    cpu_utilization: float | None = None
    cpu_memory_total_bytes: int | None = None
    cpu_memory_used_bytes: int | None = None
    gpus: tuple[GpuSample, ...] = field(default_factory=tuple)


def read_cpu_times(path: str = "/proc/stat") -> tuple[int, int] | None:
    """(busy, total) jiffies of all cores together, or None where /proc/stat is unreadable."""
    try:
        with open(path, encoding="ascii") as handle:
            line = handle.readline()
    except OSError:
        return None
    parts = line.split()
    if not parts or parts[0] != "cpu":
        return None
    values = [int(v) for v in parts[1:9]]
    total = sum(values)
    idle = sum(values[i] for i in _IDLE_COLUMNS if i < len(values))
    return total - idle, total


def read_memory(path: str = "/proc/meminfo") -> tuple[int, int] | None:
    """(total, used) bytes, used = MemTotal - MemAvailable (as Triton computes it)."""
    info: dict[str, int] = {}
    try:
        with open(path, encoding="ascii") as handle:
            for line in handle:
                name, _, rest = line.partition(":")
                fields = rest.split()
                if fields:
                    info[name] = int(fields[0]) * 1024
    except (OSError, ValueError):
        return None
    if "MemTotal" not in info or "MemAvailable" not in info:
        return None
    total = info["MemTotal"]
    return total, total - min(info["MemAvailable"], total)


class _Nvml:
    """The visible NVIDIA GPUs through NVML; `handles` is empty when there are none."""

    def __init__(self) -> None:
        self.nvml: Any = None
        self.handles: list[tuple[str, Any]] = []
        self._energy_start: dict[str, float] = {}
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            count = int(pynvml.nvmlDeviceGetCount())
            handles = []
            for index in range(count):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = pynvml.nvmlDeviceGetUUID(handle)
                if isinstance(uuid, bytes):
                    uuid = uuid.decode()
                handles.append((str(index), str(uuid), handle))
        except Exception as exc:  # no package, no driver, no GPU
            log.debug("GPU metrics unavailable: %s", exc)
            return
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            wanted = [v.strip() for v in visible.split(",") if v.strip()]
            handles = [
                h for h in handles if h[0] in wanted or any(h[1].startswith(w) for w in wanted)
            ]
        self.handles = [(uuid, handle) for _, uuid, handle in handles]
        for uuid, handle in self.handles:
            self._energy_start[uuid] = self._energy_mj(handle)

    def _energy_mj(self, handle: Any) -> float:
        try:
            return float(self.nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
        except Exception:
            return 0.0

    def sample(self) -> tuple[GpuSample, ...]:
        nvml = self.nvml
        out = []
        for uuid, handle in self.handles:
            try:
                utilization = nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                try:
                    power = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
                    limit = nvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000.0
                except Exception:
                    power = limit = 0.0
                energy = (self._energy_mj(handle) - self._energy_start[uuid]) / 1000.0
            except Exception as exc:
                log.debug("failed to read GPU %s: %s", uuid, exc)
                continue
            out.append(
                GpuSample(
                    uuid=uuid,
                    utilization=float(utilization),
                    memory_total_bytes=int(memory.total),
                    memory_used_bytes=int(memory.used),
                    power_usage_w=float(power),
                    power_limit_w=float(limit),
                    energy_j=max(0.0, energy),
                )
            )
        return tuple(out)

    def close(self) -> None:
        if self.nvml is not None:
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()
            self.nvml = None


class SystemMetrics:
    """Polls CPU and GPU gauges on a daemon thread; `snapshot` is the latest reading."""

    def __init__(self, interval_ms: int = 2000, cpu: bool = True, gpu: bool = True) -> None:
        self.interval_s = max(interval_ms, 1) / 1000.0
        self.cpu = cpu
        self.gpu = gpu
        self.snapshot = SystemSnapshot()
        self._last_cpu: tuple[int, int] | None = None
        self._nvml: _Nvml | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if not (self.cpu or self.gpu):
            return
        if self.gpu:
            self._nvml = _Nvml()
        if self.cpu:
            self._last_cpu = read_cpu_times()
        self.poll()
        self._thread = threading.Thread(target=self._run, name="oceanus-metrics-poll", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll()
            except Exception:  # never let a bad reading end the thread
                log.exception("failed to poll machine metrics")

    def poll(self) -> SystemSnapshot:
        """Read the machine now and publish the result as `snapshot`."""
        utilization = total = used = None
        if self.cpu:
            times = read_cpu_times()
            if times is not None:
                utilization = 0.0
                if self._last_cpu is not None:
                    busy = times[0] - self._last_cpu[0]
                    span = times[1] - self._last_cpu[1]
                    if span > 0:
                        utilization = min(1.0, max(0.0, busy / span))
                self._last_cpu = times
            memory = read_memory()
            if memory is not None:
                total, used = memory
        gpus = self._nvml.sample() if self._nvml is not None else ()
        self.snapshot = SystemSnapshot(utilization, total, used, gpus)
        return self.snapshot

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._nvml is not None:
            self._nvml.close()
            self._nvml = None
