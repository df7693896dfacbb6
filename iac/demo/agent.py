"""One agent process of ``iac demo``: ``python -m iac.demo.agent ROLE --dir DIR [--registry ID@URL]``.

ROLE is ``registry``, ``planner``, ``researcher``, ``writer`` or ``checker``; its key is
``DIR/ROLE.key`` (written by the demo driver, mode 0600). The agent reports to the driver with one
JSON object per line on stdout (``{"event": "ready" | "link" | "row" | "broadcast" | "file" |
"verified" | "relayed" | "done" | "error" | "bye", ...}``) and stops when its stdin closes (or on
SIGTERM). A ``go`` line on stdin lets it send its step (:meth:`Agent.my_turn`): the driver paces the
steps so that each sender's byte count covers its own exchange only.

The scenario (driven by the planner once it starts; every other agent reacts):

* the planner finds ``research``, ``write`` and ``check`` through the registry (capability lookups);
* it calls the researcher's exposed ``sources()`` (a remote call over QUIC);
* it delegates step 1/4 (ASSIGN_TASK) to the researcher, who passes step 2/4 (PROVIDE_INFO) to the
  writer (TLS), who sends the draft file to the checker's inbox and passes step 3/4 (ASSIGN_TASK)
  to it (UNIX socket); the checker verifies the file's SHA-256 and hands step 4/4 (FINAL_RESULT)
  back to the planner through the writer (it listens only on a UNIX socket beside the writer and
  publishes no address);
* the planner asks the checker for its verdict through the writer (a relayed request), then
  broadcasts "task done", which every other node's handler receives once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys

from iac.demo.driver import ROLES
from iac.demo.roles import RUNNERS
from iac.demo.runtime import Agent, DemoError, emit
from iac.errors import IacError


async def _read_stdin(agent: Agent) -> None:
    """``go`` lines from the driver (see :meth:`Agent.my_turn`); stop when stdin closes."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    with contextlib.suppress(OSError, ValueError):
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while line := await reader.readline():
            if line.strip() == b"go":
                agent.turns.put_nowait("go")
    agent.stop.set()


async def main_async(role: str, args: argparse.Namespace) -> int:
    agent = Agent(role, args)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, agent.stop.set)
    watcher = loop.create_task(_read_stdin(agent))
    try:
        await RUNNERS[role](agent)
    finally:
        watcher.cancel()
        for job in list(agent.jobs):
            job.cancel()
    emit("bye", role=role, broadcasts=agent.broadcasts)
    return 1 if agent.failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m iac.demo.agent", description="one agent of `iac demo`")
    parser.add_argument("role", choices=ROLES)
    parser.add_argument("--dir", required=True, help="the demo's directory (keys, sockets, files)")
    parser.add_argument("--registry", action="append", default=[], metavar="ID@URL", help="the registry")
    args = parser.parse_args(argv)
    try:
        return asyncio.run(main_async(args.role, args))
    except (IacError, DemoError, OSError) as exc:
        emit("error", role=args.role, message=f"{type(exc).__name__}: {exc}")
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
