"""The same A2A calls over A2A's JSON-RPC over HTTP and over the IAC binding (QUIC, TLS, UNIX).

    .venv/bin/iac bench --only a2a [--quick]

One server process hosts the same a2a-sdk agent as a stock JSON-RPC server (uvicorn) and on an
IAC node; the client makes the same calls through ``JsonRpcTransport`` and ``IacTransport``, in
turns: ``SendMessage`` p50 and calls/s at 64 in flight, parts/s of one ``SendStreamingMessage``,
and bytes per ``SendMessage`` at the socket through a counting relay. HTTP is plain; every IAC
call is signed and verified both ways."""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

from iac.bench.harness import counting
from iac.bench.harness.paths import TEST_CORPUS, module_argv
from iac.bench.harness.process import Endpoint
from iac.bench.harness.results import turn_order

HTTP = "A2A JSON-RPC/HTTP"
IAC = {"quic": "A2A over IAC-QUIC", "tls": "A2A over IAC-TLS/TCP", "unix": "A2A over IAC-UNIX"}
CORPUS = TEST_CORPUS
QUICK = {"rounds": 1, "sequential": 30, "concurrent": 96, "parts": 50, "bytes_calls": 20}
FULL = {"rounds": 5, "sequential": 500, "concurrent": 2000, "parts": 1000, "bytes_calls": 200}


def available() -> str | None:
    """Why the scenario cannot run here, or None."""
    try:
        import a2a  # noqa: F401
        import httpx  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        return f"{exc.name} not installed — pip install 'iac[a2a]'"
    return None


# --- the server process -----------------------------------------------------------------------


async def serve(workdir: str) -> None:
    """The agent behind both bindings; prints its addresses as one JSON line, runs until stdin
    closes."""
    import contextlib
    import socket

    import uvicorn
    from a2a.helpers import new_task_from_user_message, new_text_message
    from a2a.server.agent_execution import AgentExecutor
    from a2a.server.request_handlers import DefaultRequestHandler
    from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
    from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
    from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, Part
    from starlette.applications import Starlette

    from iac.integrations import a2a as ia
    from iac.node.node import Node

    class Echo(AgentExecutor):
        async def execute(self, context: Any, queue: Any) -> None:
            text = context.get_user_input()
            if not text.startswith("stream "):
                await queue.enqueue_event(new_text_message(f"done: {len(text)} characters"))
                return
            task = context.current_task or new_task_from_user_message(context.message)
            await queue.enqueue_event(task)
            updater = TaskUpdater(queue, task.id, task.context_id)
            for i in range(int(text.split()[1])):
                await updater.add_artifact([Part(text=f"part {i} of the answer")], name=f"p{i}")
            await updater.complete()

        async def cancel(self, context: Any, queue: Any) -> None:
            await TaskUpdater(queue, context.task_id, context.context_id).cancel()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/"
    card = AgentCard(
        name="bench", description="echo", version="1", default_input_modes=["text/plain"],
        default_output_modes=["text/plain"], capabilities=AgentCapabilities(streaming=True),
        skills=[AgentSkill(id="echo", name="echo", description="echo", tags=["bench"])],
        supported_interfaces=[AgentInterface(protocol_binding="JSONRPC", protocol_version="1.0", url=url)],
    )  # fmt: skip
    handler = DefaultRequestHandler(Echo(), InMemoryTaskStore(), card)
    routes = [*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/")]
    config = uvicorn.Config(
        Starlette(routes=routes), host="127.0.0.1", port=port, log_level="warning", timeout_keep_alive=900
    )  # idle keep-alive connections stay open between rounds
    server = uvicorn.Server(config)
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
    http_task = asyncio.create_task(server.serve())
    listen = ["quic://127.0.0.1:0", "tls://127.0.0.1:0", f"unix://{workdir}/agent.sock"]
    async with Node(listen=listen) as node:
        ia.serve(node, handler, card)
        while not server.started:
            await asyncio.sleep(0.01)
        by_scheme = {a.split("://")[0]: a for a in node.addresses}
        info = {"http": url, "agent_id": node.agent_id, **by_scheme, "pid": os.getpid()}
        print(json.dumps(info), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.buffer.read)
    server.should_exit = True
    await http_task


# --- the client side --------------------------------------------------------------------------


def texts(n: int) -> list[str]:
    lines = [line for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]
    return random.Random(7).sample(lines, min(n, len(lines)))


class Contender:
    """One binding's ``ClientTransport`` (and what it runs on)."""

    def __init__(self, name: str, info: dict[str, Any], via: str | None = None) -> None:
        self.name, self.info, self.via = name, info, via
        self.node: Any = None
        self.http: Any = None
        self.transport: Any = None

    async def start(self) -> None:
        import httpx
        from a2a.client.transports.jsonrpc import JsonRpcTransport
        from a2a.types import AgentCapabilities, AgentCard

        from iac.integrations import a2a as ia
        from iac.node.node import Node

        card = AgentCard(name="bench", capabilities=AgentCapabilities(streaming=True))
        if self.name == HTTP:
            limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
            self.http = httpx.AsyncClient(limits=limits, headers={"A2A-Version": "1.0"}, timeout=60)
            self.transport = JsonRpcTransport(self.http, card, self.via or self.info["http"])
        else:
            scheme = next(k for k, v in IAC.items() if v == self.name)
            self.node = Node()
            await self.node.start()
            url = ia.interface_url(self.info["agent_id"], [self.via or self.info[scheme]])
            self.transport = ia.IacTransport(self.node, card, url, timeout=60, stream_timeout=120, window=64)

    async def close(self) -> None:
        if self.http is not None:
            await self.http.aclose()
        if self.node is not None:
            await self.node.close()

    async def send(self, text: str) -> None:
        from a2a.types import Message, Part, Role, SendMessageRequest

        msg = Message(role=Role.ROLE_USER, message_id="m", parts=[Part(text=text)])
        out = await self.transport.send_message(SendMessageRequest(message=msg))
        if not out.HasField("message"):
            raise RuntimeError(f"{self.name}: no message answered")

    async def stream(self, parts: int) -> int:
        from a2a.types import Message, Part, Role, SendMessageRequest

        msg = Message(role=Role.ROLE_USER, message_id="s", parts=[Part(text=f"stream {parts}")])
        got = 0
        async for ev in self.transport.send_message_streaming(SendMessageRequest(message=msg)):
            got += ev.HasField("artifact_update")
        return got


async def sequential_p50(c: Contender, payloads: list[str], n: int) -> float:
    samples = []
    for i in range(n):
        t = time.perf_counter()
        await c.send(payloads[i % len(payloads)])
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e6


async def rate_at_64(c: Contender, payloads: list[str], n: int) -> float:
    sem = asyncio.Semaphore(64)

    async def one(i: int) -> None:
        async with sem:
            await c.send(payloads[i % len(payloads)])

    t = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return n / (time.perf_counter() - t)


async def parts_per_second(c: Contender, parts: int) -> float:
    t = time.perf_counter()
    got = await c.stream(parts)
    if got != parts:
        raise RuntimeError(f"{c.name}: {got} of {parts} parts")
    return parts / (time.perf_counter() - t)


async def bytes_per_call(name: str, info: dict[str, Any], payloads: list[str], n: int, workdir: str) -> float:
    """Bytes at the socket per SendMessage, both ways, on a fresh connection (after a warm-up)."""

    url = info[{HTTP: "http", IAC["quic"]: "quic", IAC["tls"]: "tls"}.get(name, "unix")]
    relay, addr = await counting.relay_for(url, f"{workdir}/proxy-{len(name)}.sock")
    scheme = url.split("://")[0]
    via = f"unix://{addr[1]}" if addr[0] == "unix" else f"{scheme}://{addr[1]}:{addr[2]}"
    via += "/" if scheme == "http" else ""
    c = Contender(name, info, via)
    try:
        await c.start()
        for i in range(5):
            await c.send(payloads[i])
        await asyncio.sleep(0.05)
        before = relay.total
        for i in range(n):
            await c.send(payloads[i % len(payloads)])
        await asyncio.sleep(0.05)
        return float((relay.total - before) / n)
    finally:
        await c.close()
        await relay.close()


async def measure(plan: dict[str, int], say: Callable[[str], None]) -> dict[str, Any]:
    payloads = texts(max(plan["sequential"], 200))
    names = [HTTP, *IAC.values()]
    figures: dict[str, dict[str, list[float]]] = {
        n: {"p50_us": [], "rps_64": [], "parts_per_s": []} for n in names
    }
    steps: dict[str, Callable[[Contender], Awaitable[float]]] = {
        "p50_us": lambda c: sequential_p50(c, payloads, plan["sequential"]),
        "rps_64": lambda c: rate_at_64(c, payloads, plan["concurrent"]),
        "parts_per_s": lambda c: parts_per_second(c, plan["parts"]),
    }
    with tempfile.TemporaryDirectory(prefix="iac-a2a-") as workdir:
        server = Endpoint(module_argv("iac.bench.scenarios.a2a_calls", workdir), ready=False, stderr=None)
        try:
            info = server.read(60)
            contenders = {n: Contender(n, info) for n in names}
            for c in contenders.values():
                await c.start()
            for c in contenders.values():  # warm-up: connections (64 for HTTP), caches, dictionaries
                await sequential_p50(c, payloads, 10)
                await rate_at_64(c, payloads, 64)
                await parts_per_second(c, 10)
            for r, order in enumerate(turn_order(names, plan["rounds"])):
                say(f"round {r + 1}/{plan['rounds']}")
                for name in order:
                    for metric, step in steps.items():
                        figures[name][metric].append(await step(contenders[name]))
            for c in contenders.values():
                await c.close()
            say("bytes on the wire")
            wire = {n: await bytes_per_call(n, info, payloads, plan["bytes_calls"], workdir) for n in names}
        finally:
            server.close()
    ratios: dict[str, dict[str, float]] = {}
    for name in IAC.values():
        rr: dict[str, float] = {
            m: statistics.median(a / b for a, b in zip(figures[name][m], figures[HTTP][m], strict=True))
            for m in figures[name]
        }
        rr["bytes_per_call"] = wire[name] / wire[HTTP]
        ratios[name] = {k: round(v, 3) for k, v in rr.items()}
    return {"plan": plan, "figures": figures, "bytes_per_call": wire, "ratios_to_http": ratios}


# --- the suite's scenario ---------------------------------------------------------------------


def scenario(ctx: Any, res: Any) -> None:
    """``iac bench --only a2a``: the server in a child process, the figures as the suite's rows."""
    why = available()
    if why is not None:
        res.status, res.reason = "skipped", why
        return
    data = asyncio.run(measure(QUICK if ctx.quick else FULL, ctx.progress))
    res.baseline = HTTP
    for name, f in data["figures"].items():
        res.add(name, "SendMessage p50, 1 in flight", "µs", f["p50_us"])
        res.add(name, "SendMessage calls/s, 64 in flight", "calls/s", f["rps_64"], better="higher")
        res.add(name, "streamed parts/s, one stream", "parts/s", f["parts_per_s"], better="higher")
        res.add(name, "bytes per SendMessage at the socket", "B", [data["bytes_per_call"][name]])
    for r in res.rows:
        r["iac"] = r["contender"] != HTTP
    plan = data["plan"]
    res.notes.append(
        f"iac/bench/scenarios/a2a_calls.py: {plan['rounds']} rounds, contenders taking turns; per round "
        f"{plan['sequential']} sequential SendMessage calls, {plan['concurrent']} at 64 in flight, one "
        f"SendStreamingMessage of {plan['parts']} artifact updates; bytes over {plan['bytes_calls']} calls "
        "on a fresh connection through a counting relay. Same a2a-sdk agent, same server process; "
        "HTTP is plain (no TLS, no auth), IAC signs and verifies every message. Ratios to HTTP (median "
        "of per-round ratios): "
        + "; ".join(
            f"{n}: " + ", ".join(f"{k} {v:.2f}" for k, v in r.items())
            for n, r in data["ratios_to_http"].items()
        )
    )
    res.raw = data


if __name__ == "__main__":  # the server process: python -m iac.bench.scenarios.a2a_calls DIR
    asyncio.run(serve(sys.argv[1]))
