"""How many cores this machine gives a benchmark right now: two-process scaling and load.

:class:`Calibrator` measures it between the repetitions of a benchmark (benchmarks/README.md,
"Calibration"): two worker processes run a fixed loop alone and at once, and the scaling is the
lower of the throughput ratio and the CPU share; a repetition whose scaling is below
:data:`MIN_SCALING` did not have two cores, and its figures are reported but not judged.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

#: Below this two-process scaling a repetition is not judged by a target that needs two cores.
MIN_SCALING = 1.8
#: The pieces of one signed message's way, each timed alone (``scenarios/primitives.py``); the
#: node reports add them up.
PIECES = (
    "json",
    "build",
    "sign",
    "compress",
    "frame encode",
    "frame decode",
    "decompress",
    "parse",
    "verify",
)
#: Seconds the loop takes alone (the whole calibration takes about three times this).
LOOP_SECONDS = 0.1


def spin(n: int) -> int:
    """The fixed CPU-bound loop (pure Python, no allocation that grows)."""
    x = 0
    for i in range(n):
        x ^= i * i
    return x


def loadavg() -> dict[str, Any] | None:
    """``/proc/loadavg``: ``{"1m", "5m", "15m", "runnable", "tasks"}``, or None (not Linux)."""
    try:
        f = Path("/proc/loadavg").read_text().split()
    except OSError:
        return None
    runnable, tasks = f[3].split("/")
    return {
        "1m": float(f[0]),
        "5m": float(f[1]),
        "15m": float(f[2]),
        "runnable": int(runnable) - 1,
        "tasks": int(tasks),
    }


def cpu_times() -> list[int] | None:
    """The aggregate ``cpu`` line of ``/proc/stat`` (clock ticks), or None."""
    try:
        with open("/proc/stat") as f:
            return [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None


def cpu_usage(before: list[int] | None, after: list[int] | None) -> dict[str, float] | None:
    """Busy cores (all processes) and steal share between two :func:`cpu_times` snapshots."""
    if not before or not after:
        return None
    d = [b - a for a, b in zip(before, after, strict=False)]
    total = sum(d[:8]) or 1  # user nice system idle iowait irq softirq steal
    idle = d[3] + d[4]
    steal = d[7] if len(d) > 7 else 0
    return {
        "busy_cores": round((total - idle - steal) / total * (os.cpu_count() or 1), 2),
        "steal_pct": round(steal / total * 100, 1),
    }


class Calibrator:
    """Two worker processes that measure two-process scaling on demand (blocking, ~0.4 s)."""

    def __init__(self, loop_seconds: float = LOOP_SECONDS) -> None:
        self.loop_seconds = loop_seconds
        self.n = 0
        self._workers: list[subprocess.Popen[str]] = []
        self._stat: list[int] | None = None

    def start(self) -> None:
        for _ in range(2):
            self._workers.append(
                subprocess.Popen(
                    [sys.executable, "-m", "iac.bench.harness.calibrate", "--worker"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    bufsize=1,
                )
            )
        probe = 200_000
        self._ask([0], probe)  # warm: imports done, loop compiled
        t = min(self._ask([0], probe)[0][0], self._ask([1], probe)[0][0])
        self.n = max(10_000, int(probe * self.loop_seconds / max(t, 1e-6)))
        self._stat = cpu_times()

    def _ask(self, which: list[int], n: int) -> list[tuple[float, ...]]:
        """Run the loop ``n`` times in the workers ``which`` at once: ``(wall, cpu)`` of each."""
        for w in which:
            stdin = self._workers[w].stdin
            assert stdin is not None
            stdin.write(f"{n}\n")
            stdin.flush()
        out = []
        for w in which:
            stdout: IO[str] | None = self._workers[w].stdout
            assert stdout is not None
            line = stdout.readline()
            if not line:
                raise RuntimeError("calibration worker exited")
            out.append(tuple(float(v) for v in line.split()))
        return out

    def measure(self) -> dict[str, Any]:
        """One calibration: scaling, the load average, and the CPU use since the previous one."""
        stat = cpu_times()
        usage = cpu_usage(self._stat, stat)
        alone_a = self._ask([0], self.n)[0][0]
        both = self._ask([0, 1], self.n)
        alone = min(alone_a, self._ask([1], self.n)[0][0])
        self._stat = cpu_times()
        throughput = alone / both[0][0] + alone / both[1][0]
        share = both[0][1] / both[0][0] + both[1][1] / both[1][0]
        scaling = min(throughput, share)
        # keep the loop near loop_seconds (start() may have sized it on a busy machine)
        self.n = max(10_000, int(self.n * min(4.0, self.loop_seconds / max(alone, 1e-6))))
        return {
            "time": round(time.time(), 1),
            "scaling": round(scaling, 2),
            "throughput_scaling": round(throughput, 2),
            "cpu_share": round(share, 2),
            "alone_s": round(alone, 4),
            "both_s": [round(b[0], 4) for b in both],
            "loadavg": loadavg(),
            "since_previous": usage,
        }

    def close(self) -> None:
        for w in self._workers:
            with contextlib.suppress(Exception):
                assert w.stdin is not None
                w.stdin.close()
            try:
                w.wait(5)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait()
        self._workers.clear()


def _worker() -> None:
    for line in sys.stdin:
        n = int(line)
        t, c = time.perf_counter(), time.process_time()
        spin(n)
        sys.stdout.write(f"{time.perf_counter() - t:.6f} {time.process_time() - c:.6f}\n")
        sys.stdout.flush()


if __name__ == "__main__":  # a worker process of :class:`Calibrator` (``--worker``)
    _worker()
