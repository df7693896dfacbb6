"""The receiving node of the exhaustion tests (tests/test_exhaustion.py), in a process of its own.

Run as ``python tests/exhaustion_receiver.py CONFIG_JSON``. CONFIG_JSON names the
addresses to listen on (``listen``) and ``TransportConfig`` fields to set
(``transport``). The node answers every RUN request with its payload. Its memory is
measured here, away from the test process's own allocations (libzstd allocates
outside tracemalloc, so RSS is what counts).

It speaks JSON lines: on stdout it first prints ``{"id", "addrs", "rss"}``; then it
answers each command read on stdin:

* ``{"cmd": "mark"}``: reset the peak (``VmHWM``), print ``{"rss"}`` (what is live now).
* ``{"cmd": "peak"}``: print ``{"peak", "rss"}`` (bytes: the highest RSS since ``mark``, and
  what is live now: after a collection and ``malloc_trim``, so memory the C allocator
  keeps for reuse does not count as held).
* ``{"cmd": "stats"}``: print ``{"connections", "handled", "budget_used"}`` (the node's
  receive budget in use, ``TransportConfig.memory``).
* ``{"cmd": "quit"}``: close and exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import json
import os
import re
import sys
import threading
from typing import Any

from iac.node.config import NodeConfig
from iac.node.node import Context, Node
from iac.transport.base import TransportConfig
from iac.wire._pb.iac_pb2 import MessageType

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    """Resident set size now, in bytes (``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def live() -> int:
    """RSS after a garbage collection and after the C heap gave its free memory back
    (``malloc_trim``): what is still referenced, not what the allocator keeps for reuse."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)
    return rss()


class Peak:
    """The highest RSS since :meth:`mark`: the kernel's ``VmHWM`` (reset through
    ``clear_refs``), else a thread sampling ``statm`` every millisecond."""

    def __init__(self) -> None:
        self.kernel = self._reset()
        self.sampled = rss()
        self._stop = threading.Event()
        if not self.kernel:
            threading.Thread(target=self._sample, daemon=True).start()

    @staticmethod
    def _reset() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            return False
        return True

    def _sample(self) -> None:
        while not self._stop.wait(0.001):
            self.sampled = max(self.sampled, rss())

    def mark(self) -> int:
        now = live()
        self.sampled = now
        if self.kernel:
            self._reset()
        return now

    def peak(self) -> int:
        if self.kernel:
            with open("/proc/self/status") as f:
                found = re.search(r"VmHWM:\s+(\d+) kB", f.read())
            if found:
                return int(found.group(1)) * 1024
        return max(self.sampled, rss())


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def main(spec: dict[str, Any]) -> None:
    base = NodeConfig().transport
    transport = TransportConfig(**{**_fields(base), **spec.get("transport", {})})
    config = NodeConfig(transport=transport)
    peak = Peak()
    async with Node(listen=spec["listen"], config=config) as node:

        @node.on(MessageType.RUN)
        async def echo(ctx: Context) -> object:
            return ctx.payload

        gc.collect()
        emit({"id": node.agent_id, "addrs": node.addresses, "rss": peak.mark()})
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while line := await reader.readline():
            cmd = json.loads(line)["cmd"]
            if cmd == "mark":
                emit({"rss": peak.mark()})
            elif cmd == "peak":
                high = peak.peak()
                emit({"rss": live(), "peak": high})
            elif cmd == "stats":
                st = node.stats()
                used = transport.memory.used
                emit({"connections": st.connections, "handled": st.handled, "budget_used": used})
            elif cmd == "quit":
                break


def _fields(config: TransportConfig) -> dict[str, Any]:
    """The fields a receiver keeps from the node's default transport settings."""
    return {"dictionaries": config.dictionaries}


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(json.loads(sys.argv[1])))
