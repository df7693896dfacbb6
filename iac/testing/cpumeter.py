"""CPU per process from ``/proc``: :func:`cpu_seconds`, and :class:`CpuMeter`, which turns two readings
into CPU % per process; a run with any process above :data:`CPU_LIMIT_PERCENT` measured its CPU, not
the path (:func:`cpu_limited`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

#: A run with any process above this CPU % measured its CPU, not the path.
CPU_LIMIT_PERCENT = 90.0


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (None when it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state is fields[0]
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_cpu() -> tuple[float, float] | None:
    """(busy, total) jiffies of the whole machine so far, from ``/proc/stat``."""
    try:
        first = Path("/proc/stat").read_text(encoding="ascii").split("\n", 1)[0].split()
    except OSError:
        return None
    ticks = [float(x) for x in first[1:9]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return sum(ticks) - idle, sum(ticks)


class CpuMeter:
    """CPU % of named processes between :meth:`start` and :meth:`stop` (100 % = one core), and
    ``machine``: the share of all cores that anything used meanwhile (other work included)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = dict(pids)
        self._t0 = 0.0
        self._cpu0: dict[str, float | None] = {}
        self._machine0: tuple[float, float] | None = None
        self.percent: dict[str, float] = {}
        self.machine: float | None = None

    def start(self) -> CpuMeter:
        self._t0 = time.monotonic()
        self._cpu0 = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self._machine0 = machine_cpu()
        return self

    def stop(self) -> dict[str, float]:
        wall = max(time.monotonic() - self._t0, 1e-6)
        out: dict[str, float] = {}
        for name, pid in self.pids.items():
            before, after = self._cpu0.get(name), cpu_seconds(pid)
            if before is not None and after is not None:
                out[name] = round(100.0 * (after - before) / wall, 1)
        m0, m1 = self._machine0, machine_cpu()
        self.machine = None
        if m0 is not None and m1 is not None and m1[1] > m0[1]:
            self.machine = round(100.0 * (m1[0] - m0[0]) / (m1[1] - m0[1]), 1)
        self.percent = out
        return out


def cpu_limited(percent: dict[str, float]) -> list[str]:
    """The processes above :data:`CPU_LIMIT_PERCENT` (a run with any is CPU-limited)."""
    return sorted(name for name, p in percent.items() if p > CPU_LIMIT_PERCENT)
