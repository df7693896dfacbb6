"""Endpoints in child processes, driven by JSON lines on stdin/stdout: :class:`Endpoint` (one process)
and :class:`Pair` (a server and a client endpoint of one contender).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# --- driving endpoints from another process -----------------------------------------------------


class EndpointError(RuntimeError):
    pass


def say(obj: Any) -> None:
    """One JSON line on stdout: what an endpoint tells the process driving it."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def stdin_lines() -> asyncio.StreamReader:
    """This process's stdin as a stream: the driver's commands, read without blocking the loop."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


async def commands() -> AsyncIterator[dict[str, Any]]:
    """The driver's commands, one JSON object a line, until it closes stdin."""
    reader = await stdin_lines()
    while line := await reader.readline():
        yield json.loads(line)


class Endpoint:
    """A child process and its JSON-lines conversation; ``ready``: wait for its ``{"ready": true}``
    line (kept as ``first``) before returning."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str] | None = None,
        timeout: float = 30.0,
        ready: bool = True,
        stderr: int | None = subprocess.PIPE,
    ) -> None:
        pipe = subprocess.PIPE
        self.proc = subprocess.Popen(
            argv, stdin=pipe, stdout=pipe, stderr=stderr, text=True, bufsize=1, env=env
        )
        self.pid = self.proc.pid
        if ready:
            self.first = self.read(timeout)
            if not self.first.get("ready"):
                raise EndpointError(f"endpoint did not start: {self.first}")

    def read(self, timeout: float) -> dict[str, Any]:
        out = self.proc.stdout
        assert out is not None
        ready, _, _ = select.select([out], [], [], timeout)
        if not ready:
            raise EndpointError(f"no answer within {timeout:.0f} s from {self.proc.args!r}")
        line = out.readline()
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise EndpointError(f"endpoint exited ({self.proc.poll()}): {err.strip()[-800:]}")
        obj: dict[str, Any] = json.loads(line)
        return obj

    def tell(self, cmd: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def ask(self, cmd: dict[str, Any], timeout: float = 120.0) -> dict[str, Any]:
        self.tell(cmd)
        return self.read(timeout)

    def cpu_seconds(self) -> float | None:
        """The process's CPU time so far (:func:`process_cpu_seconds`)."""
        return process_cpu_seconds(self.pid)

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                if self.proc.stdin is not None:
                    self.proc.stdin.close()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            with contextlib.suppress(OSError, ValueError):
                if stream is not None:
                    stream.close()


@dataclass
class Pair:
    """A server and a client endpoint of one contender."""

    contender: str
    server: Endpoint
    client: Endpoint

    def run(self, depth: int, count: int, timeout: float = 300.0) -> dict[str, Any]:
        s0 = self.server.ask({"cmd": "cpu"})
        res = self.client.ask({"cmd": "run", "depth": depth, "count": count}, timeout)
        s1 = self.server.ask({"cmd": "cpu"})
        res["server_cpu_s"] = s1["cpu_s"] - s0["cpu_s"]
        res["server_handled"] = s1["handled"] - s0["handled"]
        return res

    def oneway(self, count: int, timeout: float = 300.0) -> dict[str, Any]:
        """``count`` one-way messages from the client; its ``elapsed_s`` runs until the server has
        handled them all, ``server_cpu_s`` is the server's CPU over that time."""
        s0 = self.server.ask({"cmd": "cpu"})
        res = self.client.ask({"cmd": "oneway", "count": count}, timeout)
        s1 = self.server.ask({"cmd": "cpu"})
        res["server_cpu_s"] = s1["cpu_s"] - s0["cpu_s"]
        return res

    def close(self) -> None:
        self.client.close()
        self.server.close()


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu_seconds(pid: int) -> float | None:
    """CPU time of every thread of ``pid`` so far: ``/proc/PID/task/*/schedstat`` (ns), else
    ``/proc/PID/stat`` (clock ticks; threads that exited included), else None (not Linux)."""
    try:
        total = 0
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                total += int((task / "schedstat").read_text().split()[0])
        if total:
            return total / 1e9
    except OSError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime


def server_endpoint(module: str, name: str, workdir: Path, profile: str | None = None) -> Endpoint:
    """``python -m <module> --serve NAME --workdir DIR [--profile-out FILE]`` (a server of
    ``contenders.baselines.serve``), once it has said where it listens (``first``)."""
    argv = [sys.executable, "-m", module, "--serve", name, "--workdir", str(workdir)]
    return Endpoint(argv + (["--profile-out", profile] if profile else []), timeout=60, stderr=None)
