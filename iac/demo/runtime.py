"""What every agent process of ``iac demo`` shares: the event lines to the driver, a node that
records its exchanges, the meter that reports one table row, and :class:`Agent` (identity,
registries, the stop event, the driver's turns, background steps)."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iac.demo.http import http_exchange_bytes, task_json
from iac.mesh import MeshClient, parse_registry
from iac.node.config import NodeConfig, PeerEvent
from iac.node.node import Context, Node
from iac.node.types import Reply
from iac.wire._pb.iac_pb2 import TaskState
from iac.wire.enums import MessageType, message_type, type_name
from iac.wire.identity import Identity
from iac.wire.jsonutil import dumps_compact

TIMEOUT = 10.0
CAPABILITY = {"planner": "plan", "researcher": "research", "writer": "write", "checker": "check"}


class DemoError(Exception):
    """Something in the scenario did not go as it must."""


def emit(event: str, **fields: Any) -> None:
    """One JSON line to the driver."""
    print(dumps_compact({"event": event, **fields}, ensure_ascii=True), flush=True)


@dataclass(frozen=True)
class Exchange:
    """A request this node made and the REPLY it got."""

    peer: str
    msg_type: int
    payload_json: str
    task: TaskState | None
    reply: Reply


class DemoNode(Node):
    """A :class:`Node` that remembers its request/reply exchanges (for the HTTP+JSON comparison) and
    the transport of each peer connection (reported to the driver as ``link`` events)."""

    def __init__(self, identity: Identity, *, listen: list[str], config: NodeConfig | None = None) -> None:
        super().__init__(identity, listen=listen, config=config)
        self.exchanges: list[Exchange] = []
        self.on_peer(self._on_link)

    def _on_link(self, ev: PeerEvent) -> None:
        if ev.up:
            emit("link", peer=ev.agent_id, transport=ev.transport)

    async def request(
        self, peer: str, msg_type: MessageType | int | str, payload: Any = None, **kwargs: Any
    ) -> Reply:
        reply = await super().request(peer, msg_type, payload, **kwargs)
        text = kwargs.get("payload_json") or ("" if payload is None else dumps_compact(payload))
        self.exchanges.append(Exchange(peer, message_type(msg_type), text, kwargs.get("task"), reply))
        return reply


class Meter:
    """Latency, IAC bytes (this node's frames out and in, from its stats) and the HTTP+JSON size of
    the exchanges made while it runs."""

    def __init__(self, node: DemoNode) -> None:
        self.node = node
        stats = node.stats()
        self.bytes0 = stats.bytes_sent + stats.bytes_received
        self.n0 = len(node.exchanges)
        self.t0 = time.perf_counter()

    def row(
        self, key: str, step: str, dst: str, *, via: str = "", http_extra: int = 0, detail: str = ""
    ) -> None:
        ms = (time.perf_counter() - self.t0) * 1e3
        stats = self.node.stats()
        iac = stats.bytes_sent + stats.bytes_received - self.bytes0
        http = http_extra
        me = self.node.agent_id
        for ex in self.node.exchanges[self.n0 :]:
            task = task_json(ex.task) if ex.task is not None else None
            http += http_exchange_bytes(me, ex.peer, type_name(ex.msg_type), ex.payload_json,
                                        ex.reply.message, task=task)  # fmt: skip
        emit("row", key=key, step=step, dst=dst, via=via, ms=round(ms, 2), iac=iac, http=http, detail=detail)


class Agent:
    """What every role shares: the identity, the node, the mesh client, background jobs, the stop event."""

    def __init__(self, role: str, args: argparse.Namespace) -> None:
        self.role = role
        self.dir = Path(args.dir)
        self.identity = Identity.load(self.dir / f"{role}.key")
        self.registries = parse_registry(args.registry or ())
        self.stop = asyncio.Event()
        self.turns: asyncio.Queue[str] = asyncio.Queue()
        self.broadcasts = 0
        self.jobs: set[asyncio.Task[None]] = set()
        self.failed = False

    async def my_turn(self) -> None:
        """Wait for the driver's ``go`` line: the previous sender has reported its step, so the byte
        counts of two steps never overlap (the step itself was already handed over)."""
        await asyncio.wait_for(self.turns.get(), 4 * TIMEOUT)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a scenario step in the background; a failure is reported and stops the agent."""

        async def guarded() -> None:
            try:
                await coro
            except Exception as exc:  # reported to the driver, which fails the demo
                self.failed = True
                emit("error", role=self.role, message=f"{type(exc).__name__}: {exc}")
                self.stop.set()

        task = asyncio.get_running_loop().create_task(guarded())
        self.jobs.add(task)
        task.add_done_callback(self.jobs.discard)

    def on_broadcast(self, node: Node) -> None:
        async def handler(ctx: Context) -> None:
            self.broadcasts += 1
            sent_at = ctx.payload.get("sent_at", 0.0) if isinstance(ctx.payload, dict) else 0.0
            emit("broadcast", role=self.role, sender=ctx.sender, ms=round((time.time() - sent_at) * 1e3, 2),
                 count=self.broadcasts)  # fmt: skip

        node.on(MessageType.BROADCAST)(handler)

    def mesh(self, node: Node, *, addresses: list[str] | None = None) -> MeshClient:
        return MeshClient(
            node,
            registries=self.registries,
            aliases=[f"{self.role}.demo"],
            capabilities=[CAPABILITY[self.role]],
            addresses=addresses,
            timeout=TIMEOUT,
        )

    async def find_one(self, mesh: MeshClient, capability: str) -> str:
        found = await mesh.find(capability)
        if not found:
            raise DemoError(f"no agent offers {capability!r} in the registry")
        return found[0]


__all__ = ["CAPABILITY", "TIMEOUT", "Agent", "DemoError", "DemoNode", "Exchange", "Meter", "emit"]
