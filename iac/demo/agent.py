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
import hashlib
import json
import os
import random
import secrets
import signal
import sys
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iac.demo.driver import (
    FILE_CHUNK_SIZE,
    ROLES,
    VOCABULARY,
    http_exchange_bytes,
    http_file_bytes,
    http_oneway_bytes,
    task_json,
)
from iac.errors import IacError
from iac.mesh import MeshClient, parse_registry, serve_registry
from iac.node.config import ErrorCode, HandlerError, NodeConfig, PeerEvent
from iac.node.node import Node
from iac.node.types import Context, Reply
from iac.protocol.registry import RegistryState
from iac.protocol.routing import RelayPolicy
from iac.stores.records import open_record_store
from iac.wire._pb.iac_pb2 import Intent, MessageType, TaskState
from iac.wire.identity import Identity

TIMEOUT = 10.0
CAPABILITY = {"planner": "plan", "researcher": "research", "writer": "write", "checker": "check"}
_WORDS = tuple(VOCABULARY.split())


class DemoError(Exception):
    """Something in the scenario did not go as it must."""


def emit(event: str, **fields: Any) -> None:
    """One JSON line to the driver."""
    print(json.dumps({"event": event, **fields}, separators=(",", ":")), flush=True)


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


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

    async def request(self, peer: str, msg_type: int, payload: Any = None, **kwargs: Any) -> Reply:
        reply = await super().request(peer, msg_type, payload, **kwargs)
        text = kwargs.get("payload_json") or ("" if payload is None else _dumps(payload))
        self.exchanges.append(Exchange(peer, int(msg_type), text, kwargs.get("task"), reply))
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
            http += http_exchange_bytes(me, ex.peer, MessageType.Name(ex.msg_type), ex.payload_json,
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


def _check_task(ctx: Context, step: int, intent: Intent) -> TaskState:
    task = ctx.task
    if task is None or task.step != step or task.steps != 4 or task.intent != intent:
        raise HandlerError(ErrorCode.BAD_REQUEST, f"expected step {step}/4 {Intent.Name(intent)}")
    return task


def _next(task: TaskState, intent: Intent, ref: str) -> TaskState:
    """The task handed on: same id, the next step, a new intent and a pointer to the shared state."""
    ref = f"iac-demo://{task.task_id}/{ref}"
    return TaskState(task_id=task.task_id, intent=intent, step=task.step + 1, steps=task.steps, state_ref=ref)


# --- roles ------------------------------------------------------------------------------------------


async def run_registry(agent: Agent) -> None:
    store = open_record_store(f"sqlite:{agent.dir / 'registry.db'}")
    try:
        node = DemoNode(agent.identity, listen=["tls://127.0.0.1:0"])
        async with node:
            serve_registry(node, RegistryState(store))
            agent.on_broadcast(node)
            emit("ready", role=agent.role, pid=os.getpid(), agent_id=node.agent_id, addresses=node.addresses)
            await agent.stop.wait()
    finally:
        store.close()


async def run_researcher(agent: Agent) -> None:
    node = DemoNode(agent.identity, listen=["quic://127.0.0.1:0"])
    async with node:
        agent.on_broadcast(node)

        @node.expose
        def sources(topic: str, limit: int = 3) -> list[dict[str, Any]]:
            """The remote call: a (canned) literature search."""
            r = random.Random(topic)
            return [
                {"title": f"{topic.title()}: {' '.join(r.choice(_WORDS) for _ in range(5))}",
                 "url": f"https://papers.example.org/{r.getrandbits(32):08x}", "year": 2020 + r.randint(0, 5)}
                for _ in range(limit)
            ]  # fmt: skip

        async with agent.mesh(node) as mesh:

            async def step2(task: TaskState, brief: dict[str, Any]) -> None:
                writer = await agent.find_one(mesh, "write")
                await node.connect(writer)
                notes = [f"{s['title']} ({s['year']}): {s['url']}" for s in brief.get("sources", [])]
                await agent.my_turn()
                m = Meter(node)
                nxt = _next(task, Intent.PROVIDE_INFO, "notes")
                reply = await node.delegate(writer, nxt, {"goal": brief.get("goal"), "notes": notes},
                                            timeout=TIMEOUT)  # fmt: skip
                if not isinstance(reply.payload, dict) or reply.payload.get("step") != 2:
                    raise DemoError(f"the writer did not take step 2/4: {reply.payload!r:.100}")
                m.row(
                    "step2",
                    "step 2/4 PROVIDE_INFO",
                    "writer",
                    detail=f"found by capability 'write', {nxt.state_ref}",
                )

            @node.on(MessageType.DELEGATE_TASK)
            async def step1(ctx: Context) -> dict[str, Any]:
                task = _check_task(ctx, 1, Intent.ASSIGN_TASK)
                agent.spawn(step2(task, ctx.payload if isinstance(ctx.payload, dict) else {}))
                return {"accepted": task.task_id, "step": 1}

            emit("ready", role=agent.role, pid=os.getpid(), agent_id=node.agent_id, addresses=node.addresses)
            await agent.stop.wait()


def _draft(task_id: str, goal: str, notes: list[str], size: int = 48 * 1024) -> bytes:
    """A markdown draft of about ``size`` bytes."""
    r = random.Random(task_id)
    lines = [f"# {goal}", "", *[f"- {n}" for n in notes], ""]
    total = sum(len(x) + 1 for x in lines)
    section = 0
    while total < size:
        if r.random() < 0.1:
            section += 1
            line = f"\n## Section {section}\n"
        else:
            line = " ".join(r.choice(_WORDS) for _ in range(r.randint(10, 24))).capitalize() + "."
        lines.append(line)
        total += len(line) + 1
    return "\n".join(lines).encode()


async def run_writer(agent: Agent) -> None:
    config = NodeConfig(relay_policy=RelayPolicy(relay_unicast=True))  # the checker is reachable through us
    work = agent.dir / "writer"
    work.mkdir(exist_ok=True)
    node = DemoNode(agent.identity, listen=["tls://127.0.0.1:0"], config=config)
    async with node:
        agent.on_broadcast(node)
        async with agent.mesh(node) as mesh:

            async def step3(task: TaskState, info: dict[str, Any]) -> None:
                checker = await agent.find_one(mesh, "check")  # its record has no address: it is beside us
                node.add_peer(checker, f"unix://{agent.dir / 'checker.sock'}")
                await node.connect(checker)
                notes = [str(n) for n in info.get("notes", [])]
                path = work / f"draft-{task.task_id}.md"
                data = _draft(task.task_id, str(info.get("goal", "draft")), notes)
                path.write_bytes(data)
                digest = hashlib.sha256(data).hexdigest()
                await agent.my_turn()
                m = Meter(node)
                sent = await node.send_file(checker, path, chunk_size=FILE_CHUNK_SIZE, timeout=TIMEOUT)
                if sent.sha256 != digest or sent.size != len(data):
                    raise DemoError("the file sent is not the draft")
                http = http_file_bytes(node.agent_id, checker, sent.name, data)
                m.row("file", f"file {sent.name}", "checker", http_extra=http,
                      detail=f"{sent.chunks} chunks")  # fmt: skip
                m = Meter(node)
                nxt = _next(task, Intent.ASSIGN_TASK, f"{sent.name}#sha256={digest}")
                ref = {"file": sent.name, "sha256": digest, "size": sent.size}
                reply = await node.delegate(checker, nxt, ref, timeout=TIMEOUT)
                if not isinstance(reply.payload, dict) or reply.payload.get("sha256_ok") is not True:
                    raise DemoError(f"the checker did not verify the draft: {reply.payload!r:.100}")
                m.row(
                    "step3",
                    "step 3/4 ASSIGN_TASK",
                    "checker",
                    detail=f"check the draft, {nxt.state_ref[:48]}…",
                )

            @node.on(MessageType.DELEGATE_TASK)
            async def step2(ctx: Context) -> dict[str, Any]:
                task = _check_task(ctx, 2, Intent.PROVIDE_INFO)
                agent.spawn(step3(task, ctx.payload if isinstance(ctx.payload, dict) else {}))
                return {"accepted": task.task_id, "step": 2}

            emit("ready", role=agent.role, pid=os.getpid(), agent_id=node.agent_id, addresses=node.addresses)
            await agent.stop.wait()
            emit("relayed", role=agent.role, count=node.stats().routing["relayed"])


async def run_checker(agent: Agent) -> None:
    inbox = agent.dir / "checker-inbox"
    config = NodeConfig(inbox_dir=inbox)
    sock = agent.dir / "checker.sock"
    verdict: dict[str, Any] = {}
    node = DemoNode(agent.identity, listen=[f"unix://{sock}"], config=config)
    async with node:
        agent.on_broadcast(node)
        node.on_file(lambda f: emit("file", role=agent.role, name=f.name, size=f.size, sha256=f.sha256))
        # Publish no address: only the writer, beside us, can reach our UNIX socket.
        async with agent.mesh(node, addresses=[]) as mesh:

            async def step4(task: TaskState, relay: str) -> None:
                planner = await agent.find_one(mesh, "plan")
                node.add_route(planner, relay)  # everything we send goes back through the writer
                await agent.my_turn()
                m = Meter(node)
                nxt = _next(task, Intent.FINAL_RESULT, "verdict")
                reply = await node.delegate(planner, nxt, verdict, timeout=TIMEOUT)
                if not isinstance(reply.payload, dict) or reply.payload.get("step") != 4:
                    raise DemoError(f"the planner did not take step 4/4: {reply.payload!r:.100}")
                m.row(
                    "step4",
                    "step 4/4 FINAL_RESULT",
                    "planner",
                    via="writer",
                    detail="relayed back by the writer",
                )

            @node.on(MessageType.DELEGATE_TASK)
            async def step3(ctx: Context) -> dict[str, Any]:
                task = _check_task(ctx, 3, Intent.ASSIGN_TASK)
                p = ctx.payload if isinstance(ctx.payload, dict) else {}
                name = str(p.get("file", ""))
                path = inbox / name
                if not name or path.parent != inbox or not path.is_file():
                    raise HandlerError(ErrorCode.BAD_REQUEST, f"no file {name!r:.80} in the inbox")
                data = path.read_bytes()
                ok = hashlib.sha256(data).hexdigest() == p.get("sha256") and len(data) == p.get("size")
                words = len(data.split())
                verdict.update(task_id=task.task_id, verdict="approved" if ok else "rejected", sha256_ok=ok,
                               words=words, file=name)  # fmt: skip
                emit("verified", role=agent.role, name=name, sha256_ok=ok)
                if ok:
                    agent.spawn(step4(task, ctx.sender))
                return {"accepted": task.task_id, "step": 3, "sha256_ok": ok}

            @node.on(MessageType.RUN)
            async def ask(ctx: Context) -> dict[str, Any]:
                return {**verdict, "asked_by": ctx.sender}  # ctx.sender: the planner's key, not the relay's

            emit("ready", role=agent.role, pid=os.getpid(), agent_id=node.agent_id, addresses=node.addresses)
            await agent.stop.wait()


async def run_planner(agent: Agent) -> None:
    node = DemoNode(agent.identity, listen=["tls://127.0.0.1:0"])
    async with node:
        final: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

        @node.on(MessageType.DELEGATE_TASK)
        async def step4(ctx: Context) -> dict[str, Any]:
            task = _check_task(ctx, 4, Intent.FINAL_RESULT)
            if not final.done():
                final.set_result(ctx.payload if isinstance(ctx.payload, dict) else {})
            return {"accepted": task.task_id, "step": 4}

        async with agent.mesh(node) as mesh:
            emit("ready", role=agent.role, pid=os.getpid(), agent_id=node.agent_id, addresses=node.addresses)
            agent.spawn(_plan(agent, node, mesh, final))
            await agent.stop.wait()


async def _plan(
    agent: Agent, node: DemoNode, mesh: MeshClient, final: asyncio.Future[dict[str, Any]]
) -> None:
    m = Meter(node)
    team = {cap: await agent.find_one(mesh, cap) for cap in ("research", "write", "check")}
    m.row("lookup", "capability lookup ×3", "registry", detail="research, write, check → 3 AgentIds")
    researcher, writer, checker = team["research"], team["write"], team["check"]
    await node.connect(researcher)
    await node.connect(writer)
    node.add_route(checker, writer)  # the checker publishes no address: it sits beside the writer

    m = Meter(node)
    found = await node.call(researcher, "sources", "agent messaging", limit=3)
    if not isinstance(found, list) or len(found) != 3:
        raise DemoError(f"sources() returned {found!r:.100}")
    m.row("call", "remote call sources()", "researcher", detail="an exposed function, 3 results")

    task_id = f"t-{secrets.token_hex(4)}"
    task = TaskState(task_id=task_id, intent=Intent.ASSIGN_TASK, step=1, steps=4,
                     state_ref=f"iac-demo://{task_id}/brief")  # fmt: skip
    m = Meter(node)
    brief = {"goal": "A short report on agent messaging", "sources": found}
    reply = await node.delegate(researcher, task, brief, timeout=TIMEOUT)
    if not isinstance(reply.payload, dict) or reply.payload.get("step") != 1:
        raise DemoError(f"the researcher did not take step 1/4: {reply.payload!r:.100}")
    m.row("step1", "step 1/4 ASSIGN_TASK", "researcher", detail=f"task {task_id}, {task.state_ref}")

    result = await asyncio.wait_for(final, 4 * TIMEOUT)
    await agent.my_turn()
    if result.get("task_id") != task_id or result.get("verdict") != "approved":
        raise DemoError(f"unexpected final result {result!r:.120}")

    m = Meter(node)
    reply = await node.request(
        checker, MessageType.RUN, {"ask": "verdict", "task_id": task_id}, timeout=TIMEOUT
    )
    if not isinstance(reply.payload, dict) or reply.payload.get("asked_by") != node.agent_id:
        raise DemoError(f"the checker's answer through the relay is wrong: {reply.payload!r:.100}")
    m.row(
        "relay",
        "relayed request RUN",
        "checker",
        via="writer",
        detail="the checker verified the planner's signature",
    )

    m = Meter(node)
    payload = {
        "status": "task done",
        "task_id": task_id,
        "verdict": result["verdict"],
        "sent_at": time.time(),
    }
    peers = node.stats().connections
    await node.broadcast(MessageType.BROADCAST, payload)
    http = peers * http_oneway_bytes(node.agent_id, "", "BROADCAST", _dumps(payload))
    m.row(
        "broadcast",
        'broadcast "task done"',
        "*",
        http_extra=http,
        detail=f"sent to {peers} direct peers, flooded on by them",
    )
    emit("done", role=agent.role, task_id=task_id)


RUNNERS = {
    "registry": run_registry,
    "planner": run_planner,
    "researcher": run_researcher,
    "writer": run_writer,
    "checker": run_checker,
}


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
