"""The five roles of ``iac demo``, one coroutine each (see :mod:`iac.demo.agent` for the scenario).

Every role starts its node, reports ``ready`` and serves until the agent stops; the planner drives
the scenario (:func:`_plan`), the others react to the task steps handed to them.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from iac.demo.codec import VOCABULARY
from iac.demo.driver import FILE_CHUNK_SIZE
from iac.demo.http import http_file_bytes, http_oneway_bytes
from iac.demo.runtime import TIMEOUT, Agent, DemoError, DemoNode, Meter, emit
from iac.errors import ErrorCode, HandlerError
from iac.mesh import MeshClient, serve_registry
from iac.node.config import NodeConfig
from iac.node.node import Context
from iac.protocol.registry import RegistryState
from iac.protocol.routing import RelayPolicy
from iac.stores.records import open_record_store
from iac.wire.enums import Intent, MessageType
from iac.wire.jsonutil import dumps_compact
from iac.wire.task import TaskState

_WORDS = tuple(VOCABULARY.split())


def _check_task(ctx: Context, step: int, intent: Intent) -> TaskState:
    task = ctx.task
    if task is None or task.step != step or task.steps != 4 or int(task.intent) != intent:
        raise HandlerError(ErrorCode.BAD_REQUEST, f"expected step {step}/4 {intent.name}")
    return task


def _ready(agent: Agent, node: DemoNode) -> None:
    """Tell the driver that this role serves, and where."""
    emit("ready", role=agent.role, pid=os.getpid(), agent_id=node.agent_id, addresses=node.addresses)


def _take_step(
    agent: Agent,
    ctx: Context,
    step: int,
    intent: Intent,
    then: Callable[[TaskState, dict[str, Any]], Coroutine[Any, Any, None]],
) -> dict[str, Any]:
    """Accept step ``step`` of the task handed to us and run ``then`` (our part) in the background."""
    task = _check_task(ctx, step, intent)
    agent.spawn(then(task, ctx.payload if isinstance(ctx.payload, dict) else {}))
    return {"accepted": task.task_id, "step": step}


async def _hand_on(node: DemoNode, peer: str, task: TaskState, payload: Any, who: str) -> None:
    """Delegate ``task`` to ``peer`` (the ``who`` of the scenario) and check that it took the step."""
    reply = await node.delegate(peer, task, payload, timeout=TIMEOUT)
    if not isinstance(reply.payload, dict) or reply.payload.get("step") != task.step:
        raise DemoError(f"the {who} did not take step {task.step}/4: {reply.payload!r:.100}")


def _next(task: TaskState, intent: Intent, ref: str) -> TaskState:
    """The task handed on: same id, the next step, a new intent and a pointer to the shared state."""
    ref = f"iac-demo://{task.task_id}/{ref}"
    return TaskState(
        task_id=task.task_id, intent=intent.name, step=task.step + 1, steps=task.steps, state_ref=ref
    )


async def run_registry(agent: Agent) -> None:
    store = open_record_store(f"sqlite:{agent.dir / 'registry.db'}")
    try:
        node = DemoNode(agent.identity, listen=["tls://127.0.0.1:0"])
        async with node:
            serve_registry(node, RegistryState(store))
            agent.on_broadcast(node)
            _ready(agent, node)
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
                await _hand_on(node, writer, nxt, {"goal": brief.get("goal"), "notes": notes}, "writer")
                m.row(
                    "step2",
                    "step 2/4 PROVIDE_INFO",
                    "writer",
                    detail=f"found by capability 'write', {nxt.state_ref}",
                )

            @node.on(MessageType.DELEGATE_TASK)
            async def step1(ctx: Context) -> dict[str, Any]:
                return _take_step(agent, ctx, 1, Intent.ASSIGN_TASK, step2)

            _ready(agent, node)
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
                return _take_step(agent, ctx, 2, Intent.PROVIDE_INFO, step3)

            _ready(agent, node)
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
                await _hand_on(node, planner, nxt, verdict, "planner")
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

            _ready(agent, node)
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
            _ready(agent, node)
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
    task = TaskState(task_id=task_id, intent=Intent.ASSIGN_TASK.name, step=1, steps=4,
                     state_ref=f"iac-demo://{task_id}/brief")  # fmt: skip
    m = Meter(node)
    brief = {"goal": "A short report on agent messaging", "sources": found}
    await _hand_on(node, researcher, task, brief, "researcher")
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
    http = peers * http_oneway_bytes(node.agent_id, "", "BROADCAST", dumps_compact(payload))
    m.row(
        "broadcast",
        'broadcast "task done"',
        "*",
        http_extra=http,
        detail=f"sent to {peers} direct peers, flooded on by them",
    )
    emit("done", role=agent.role, task_id=task_id)


RUNNERS: dict[str, Callable[[Agent], Awaitable[None]]] = {
    "registry": run_registry,
    "planner": run_planner,
    "researcher": run_researcher,
    "writer": run_writer,
    "checker": run_checker,
}


__all__ = ["RUNNERS", "run_checker", "run_planner", "run_registry", "run_researcher", "run_writer"]
