"""A small MCP server of the stock SDK (``MCPServer``), used in process by tests/test_mcp.py and as
a real stdio MCP server process by tests/test_mcp_bridge.py (``python mcp_stdio_server.py``).

Tools: ``add``, ``whoami`` (the calling AgentId over IAC, "" elsewhere), ``count`` (reports
progress), ``block`` (waits until cancelled; ``cancelled`` resource says how many were), ``fail``
(an error result), ``ask`` (a sampling request to the client), ``sleep``. Resource
``res://greeting``. ``--misbehave exit|garbage|mute`` makes the process fail at start instead.
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and sys.argv[1:2] == ["--misbehave"]:  # before the SDK's slow imports
    how = sys.argv[2]
    if how == "exit":
        sys.exit(3)
    if how == "garbage":
        print("this is not JSON", flush=True)
    sys.stdin.read()  # "mute": never answers initialize
    sys.exit(0)

import asyncio
import os

import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

#: How many ``block`` calls were cancelled, and how many started (for the tests in process).
STATE = {"blocked": 0, "cancelled": 0}


def build() -> MCPServer:
    mcp = MCPServer("iac-test-tools")

    @mcp.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @mcp.tool()
    def whoami(ctx: Context) -> str:
        """The AgentId that signed the call (over IAC), else ''."""
        request = ctx.request_context.request
        return str(getattr(request, "agent_id", ""))

    @mcp.tool()
    def principal(ctx: Context) -> str:
        """The principal a trusted gateway named for the call (over IAC), else ''."""
        return str(getattr(ctx.request_context.request, "principal", ""))

    @mcp.tool()
    async def count(n: int, ctx: Context) -> str:
        """Report progress n times, then answer."""
        for i in range(1, n + 1):
            await ctx.report_progress(i, n, f"step {i}")
        return f"counted {n}"

    @mcp.tool()
    async def block(ctx: Context) -> str:
        """Wait until cancelled."""
        STATE["blocked"] += 1
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            STATE["cancelled"] += 1
            raise
        return "never"

    @mcp.tool()
    async def sleep(seconds: float) -> str:
        """Sleep, then answer."""
        await asyncio.sleep(seconds)
        return "slept"

    @mcp.tool()
    def crash(code: int) -> str:
        """End the process at once (a stdio server that dies mid-call)."""
        os._exit(code)

    @mcp.tool()
    def fail(why: str) -> str:
        """Always fails: an error result."""
        raise ToolError(f"failed: {why}")

    @mcp.tool()
    async def ask(question: str, ctx: Context) -> str:
        """Ask the client's model (a sampling request to the client)."""
        result = await ctx.session.create_message(
            [types.SamplingMessage(role="user", content=types.TextContent(type="text", text=question))],
            max_tokens=20,
        )
        content = result.content
        return f"the model said: {getattr(content, 'text', '?')}"

    @mcp.resource("res://greeting")
    def greeting() -> str:
        return "hello from the resource"

    @mcp.resource("res://cancelled")
    def cancelled() -> str:
        return f"{STATE['blocked']} {STATE['cancelled']}"

    return mcp


def main() -> None:
    build().run("stdio")


if __name__ == "__main__":
    main()
