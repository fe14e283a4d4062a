"""How many CPUs this process may use: the one answer that worker counts, busy polling and the
tuner's bounds share."""

from __future__ import annotations

import os

CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by its cgroup's CPU quota
    (a Kubernetes CPU limit), rounded to the nearest whole CPU and at least 1."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    try:
        with open(CGROUP_CPU_MAX) as limits:
            quota, period = limits.read().split()[:2]
        if quota != "max":
            count = min(count, max(1, int(int(quota) / int(period) + 0.5)))
    except (OSError, ValueError):
        pass
    return max(1, count)
