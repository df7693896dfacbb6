"""One node of the multi-process broadcast test (tests/test_broadcast_procs.py).

Run as ``python tests/broadcast_node.py SOCKET_PATH``. It speaks JSON lines:
on stdout it first prints ``{"id": ..., "addr": ...}``; then it reads commands
on stdin and answers each on stdout:

* ``{"cmd": "peers", "dial": [[id, addr], ...], "degree": n}``: dial those
  peers, wait until ``n`` peers are connected, print ``{"ready": true}``.
* ``{"cmd": "bcast", "k": k}``: broadcast ``{"k": k}``.
* ``{"cmd": "stats"}``: print ``{"stats": {...}}`` (routing counters).
* ``{"cmd": "quit"}``: print ``{"counts": {"<origin> <k>": n, ...}}``, close, exit.

Every broadcast handed to the handler is also reported at once as
``{"got": k, "from": origin}``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from typing import Any

from iac.node.config import NodeConfig, PeerEvent
from iac.node.node import Context, Node
from iac.wire._pb.iac_pb2 import MessageType


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def main(sock: str) -> None:
    counts: Counter[str] = Counter()
    # A ring of 20 is 10 links across; a random graph may be longer.
    config = NodeConfig(broadcast_hop_limit=32)
    async with Node(listen=[f"unix://{sock}"], config=config) as node:

        @node.on(MessageType.BROADCAST)
        async def on_broadcast(ctx: Context) -> None:
            k = ctx.payload["k"]
            counts[f"{ctx.sender} {k}"] += 1
            emit({"got": k, "from": ctx.sender})

        degree = 0
        connected = asyncio.Event()

        def on_peer(ev: PeerEvent) -> None:
            if node.stats().connections >= degree > 0:
                connected.set()

        node.on_peer(on_peer)
        emit({"id": node.agent_id, "addr": node.addresses[0]})
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while line := await reader.readline():
            cmd = json.loads(line)
            match cmd["cmd"]:
                case "peers":
                    degree = cmd["degree"]
                    for aid, addr in cmd["dial"]:
                        node.add_peer(aid, addr)
                        await node.connect(aid)
                    if node.stats().connections >= degree:
                        connected.set()
                    await asyncio.wait_for(connected.wait(), 30)
                    emit({"ready": True})
                case "bcast":
                    await node.broadcast(MessageType.BROADCAST, {"k": cmd["k"]})
                case "stats":
                    st = node.stats()
                    emit({"stats": {"routing": dict(st.routing), "route_refused": dict(st.route_refused)}})
                case "quit":
                    emit({"counts": dict(counts)})
                    break


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
