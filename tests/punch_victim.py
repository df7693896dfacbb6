"""A node that answers punch requests, for tests/test_nat_literal.py (a real process, started
inside a network namespace whose resolver never answers).

Run as ``python tests/punch_victim.py``. JSON lines on stdout: first ``{"agent_id": ...,
"url": ...}``; then, for each ``stats`` line on stdin, the traversal's counters. The process
ends when stdin closes.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from iac.mesh.nat import Traversal
from iac.node.node import Node
from iac.wire.enums import MessageType


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def main() -> None:
    async with Node(listen=["quic://127.0.0.1:0"]) as node:
        traversal = Traversal(node)
        node.on(MessageType.RUN)(lambda ctx: ctx.payload)
        emit({"agent_id": node.agent_id, "url": node.addresses[0]})
        loop = asyncio.get_running_loop()
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            if line.strip() == "stats":
                emit(traversal.stats())
        await traversal.close()


if __name__ == "__main__":
    asyncio.run(main())
