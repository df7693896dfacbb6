#!/usr/bin/env python3
"""MCP tool calls over MCP over IAC (QUIC, TLS/TCP, UNIX) against MCP's own transports.

    .venv/bin/python -m iac.bench.scenarios.mcp_calls [--quick] [--json OUT]

One server process hosts the same ``MCPServer`` (one tool, ``echo``) on an IAC node and as
streamable HTTP; a third contender is MCP stdio. The client is the SDK's ``ClientSession`` over
each, in turns: tool-call p50 and calls/s at :data:`IN_FLIGHT` in flight; benchmarks/README.md,
"MCP tool calls"."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from iac.bench.harness.paths import RESULTS
from iac.bench.harness.process import Endpoint
from iac.bench.harness.results import turn_order

HTTP = "MCP streamable HTTP"
STDIO = "MCP stdio"
IAC = {"quic": "MCP over IAC-QUIC", "tls": "MCP over IAC-TLS/TCP", "unix": "MCP over IAC-UNIX"}
QUICK = {"rounds": 2, "sequential": 40, "concurrent": 160}
FULL = {"rounds": 5, "sequential": 200, "concurrent": 800}
IN_FLIGHT = 32
TEXT = "x" * 200
SCRIPT = Path(__file__).resolve()
DEFAULT_OUT = RESULTS / "2026-12-01-mcp-calls.json"


def make_server() -> Any:
    from mcp.server.mcpserver import MCPServer

    mcp = MCPServer("bench")

    @mcp.tool()
    def echo(text: str) -> str:
        """Answer the text."""
        return text

    return mcp


# --- the server process -----------------------------------------------------------------------


async def serve(workdir: str) -> None:
    """The tool behind IAC and streamable HTTP; prints the addresses as one JSON line and runs
    until stdin closes."""
    import uvicorn

    from iac.integrations import mcp as im
    from iac.node.config import NodeConfig
    from iac.node.node import Node

    listen = ["quic://127.0.0.1:0", "tls://127.0.0.1:0", f"unix://{workdir}/run/agent.sock"]
    async with Node(listen=listen, config=im.announce(NodeConfig())) as node:
        im.serve(node, make_server(), limits=im.Limits(calls_per_peer=48, calls_total=48))
        app = make_server().streamable_http_app()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_keep_alive=60)
        http = uvicorn.Server(config)
        task = asyncio.ensure_future(http.serve(sockets=[sock]))
        while not http.started:
            await asyncio.sleep(0.01)
        print(json.dumps({"agent": node.agent_id, "addresses": node.addresses, "http": port}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        http.should_exit = True
        await task


def serve_stdio() -> None:
    make_server().run("stdio")


# --- the client -------------------------------------------------------------------------------


Opener = Callable[[], contextlib.AbstractAsyncContextManager[Any]]


def openers(info: dict[str, Any]) -> dict[str, Opener]:
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client

    from iac.integrations import mcp as im
    from iac.node.node import Node

    def iac_session(address: str) -> Opener:
        @contextlib.asynccontextmanager
        async def open_() -> AsyncIterator[Any]:
            async with Node() as node:
                node.add_peer(info["agent"], address)
                async with im.connect(node, info["agent"]) as (r, w), ClientSession(r, w) as s:
                    await s.initialize()
                    yield s

        return open_

    @contextlib.asynccontextmanager
    async def http_session() -> AsyncIterator[Any]:
        url = f"http://127.0.0.1:{info['http']}/mcp"
        async with streamable_http_client(url) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            yield s

    @contextlib.asynccontextmanager
    async def stdio_session() -> AsyncIterator[Any]:
        params = StdioServerParameters(command=sys.executable, args=[str(SCRIPT), "--stdio-server"])
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            yield s

    out: dict[str, Opener] = {HTTP: http_session, STDIO: stdio_session}
    for address in info["addresses"]:
        out[IAC[address.split("://")[0]]] = iac_session(address)
    return out


async def call(session: Any) -> None:
    result = await session.call_tool("echo", {"text": TEXT})
    if result.is_error:
        raise RuntimeError(f"echo failed: {result}")


async def measure(open_: Opener, sequential: int, concurrent: int) -> dict[str, float]:
    from iac.bench.harness.results import at_depth

    async with open_() as session:
        for _ in range(10):  # warm up
            await call(session)
        times = []
        for _ in range(sequential):
            t0 = time.perf_counter()
            await call(session)
            times.append(time.perf_counter() - t0)
        elapsed = await at_depth(lambda i: call(session), concurrent, IN_FLIGHT)
    return {"p50_ms": statistics.median(times) * 1e3, "calls_per_s": concurrent / elapsed}


async def run(sizes: dict[str, int]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="iac-mcp-") as workdir:
        server = Endpoint([sys.executable, str(SCRIPT), "--serve", workdir], ready=False, stderr=None)
        try:
            contenders = openers(server.read(60))
            names = list(contenders)
            rounds: list[dict[str, dict[str, float]]] = []
            for r, order in enumerate(turn_order(names, sizes["rounds"])):
                got = {}
                for name in order:
                    got[name] = await measure(contenders[name], sizes["sequential"], sizes["concurrent"])
                    print(f"round {r + 1} {name}: {got[name]['p50_ms']:.3f} ms p50, "
                          f"{got[name]['calls_per_s']:.0f} calls/s", file=sys.stderr)  # fmt: skip
                rounds.append(got)
        finally:
            server.close()
    medians: dict[str, dict[str, float]] = {}
    for name in names:
        medians[name] = {
            k: statistics.median(rd[name][k] for rd in rounds) for k in ("p50_ms", "calls_per_s")
        }
    base = medians[HTTP]
    ratios = {
        name: {
            "p50_vs_http": medians[name]["p50_ms"] / base["p50_ms"],
            "calls_per_s_vs_http": medians[name]["calls_per_s"] / base["calls_per_s"],
        }
        for name in names
    }
    return {"rounds": rounds, "medians": medians, "ratios": ratios}


def environment() -> dict[str, Any]:
    """The machine, the library versions and the commit, as the suite's results record them."""
    from iac.bench.harness import environment, record

    libs = ("iac", "mcp", "aioquic", "pynacl", "zstandard", "protobuf", "uvicorn", "httpx2")
    return {**environment.environment(libs), "git_dirty": bool(record.git_dirty())}


def main() -> None:
    logging.basicConfig(level=logging.WARNING)  # the libraries' INFO lines are not the figures
    for name in ("iac", "mcp", "httpx", "httpx2", "uvicorn", "aioquic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    if sys.argv[1:2] == ["--serve"]:
        asyncio.run(serve(sys.argv[2]))
        return
    if sys.argv[1:2] == ["--stdio-server"]:
        serve_stdio()
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2 rounds of 40 sequential and 160 concurrent calls")
    p.add_argument("--rounds", type=int, default=None, help="rounds (default 5; --quick 2)")
    p.add_argument(
        "--json", default=str(DEFAULT_OUT), help=f"where to write the results (default {DEFAULT_OUT})"
    )
    args = p.parse_args()
    sizes = dict(QUICK if args.quick else FULL)
    if args.rounds is not None:
        sizes["rounds"] = max(1, args.rounds)
    command = " ".join(["python -m iac.bench.scenarios.mcp_calls", *sys.argv[1:]])
    started = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    env = environment()
    t0 = time.monotonic()
    result = asyncio.run(run(sizes))
    data = {
        "benchmark": "mcp_calls",
        "sizes": sizes,
        "in_flight": IN_FLIGHT,
        "text_bytes": len(TEXT),
        **result,
    }
    out = {
        "schema": "iac-bench-record/1",
        "command": command,
        "started": started,
        "duration_s": round(time.monotonic() - t0, 1),
        "environment": env,
        "result": data,
    }
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n", "utf-8")
    from iac.bench.reports import live

    live.print_rendered(("mcp",), "iac.bench.scenarios.mcp_calls", data)


if __name__ == "__main__":
    main()
