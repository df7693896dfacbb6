"""``iac mcp``: MCP over IAC from the command line (``pip install 'iac-mesh[mcp]'``).

``iac mcp serve --key K --listen URL --stdio -- CMD ARGS...`` puts an existing stdio MCP server
(any language) on the mesh: it starts ``CMD ARGS``, makes the MCP handshake with it (within
``--init-timeout``, default 10 s) and answers MCP over IAC for it; every caller gets a session of
its own. Calls in flight are bounded per calling agent (``--calls-per-peer``, default 8) and in
total (``--calls-total``, default 48); more are answered at once with JSON-RPC error -32050.
``--allow AGENT=TOOL,TOOL`` limits tools per caller (``*`` for every caller or every tool);
``--trust-gateway AGENT`` believes that gateway's principal (field 19).
With ``--registry ID@URL`` it publishes its record with ``mcp/1``, its tools' digests and any
``--capability``. It prints ``node ID``, ``listening URL`` lines and ``tools N``; a child that
exits, writes non-JSON or does not answer ``initialize`` in time makes it print one line and exit
1. SIGINT/SIGTERM stop the child and the node; it prints its counters (``stats {...}``).

``iac mcp connect --key K --to AGENT --addr URL`` is a stdio MCP server for any MCP host: what the
host writes on stdin goes to agent AGENT over IAC, signed with K, and the answers come back on
stdout. When the agent cannot be reached, the host's requests get JSON-RPC error -32000 and one
line goes to stderr. It ends when the host closes stdin.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from typing import Any

from iac.cli import checks
from iac.cli.options import (
    add_listen_option,
    add_registry_option,
    add_transport_options,
    integer,
    print_error,
    print_listening,
    seconds,
    serve_until_signal,
    transport_config,
)
from iac.errors import ConfigError, IacError
from iac.node.config import NodeConfig
from iac.node.node import Node
from iac.protocol.records import is_capability

DEFAULTS = {"calls_per_peer": 8, "calls_total": 48, "init_timeout": 10.0}


def _mcp() -> Any:
    try:
        from iac.integrations import mcp
    except ImportError:
        raise ConfigError("iac mcp needs the MCP SDK: pip install 'iac-mesh[mcp]'") from None
    return mcp


def _allow(specs: list[str]) -> dict[str, set[str]] | None:
    if not specs:
        return None
    allow: dict[str, set[str]] = {}
    for spec in specs:
        who, sep, tools = spec.partition("=")
        if not sep or not tools:
            raise ConfigError(f"--allow {spec!r:.80}: give AGENT=TOOL[,TOOL...] (AGENT or TOOL may be *)")
        if who != "*":
            checks.agent_id("--allow AGENT=TOOLS: AGENT", who)
        allow.setdefault(who, set()).update(t.strip() for t in tools.split(",") if t.strip())
    return allow


def _command(args: argparse.Namespace) -> list[str]:
    argv = list(args.command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not args.stdio or not argv:
        raise ConfigError("give the stdio MCP server to run: iac mcp serve --stdio -- CMD ARGS...")
    return argv


async def run_serve(args: argparse.Namespace) -> int:
    argv = _command(args)
    mcp = _mcp()
    identity = checks.load_key(args.key)
    registries = checks.registries(args.registry or ())
    for cap in args.capability:
        if not is_capability(cap):
            raise ConfigError(f"--capability {cap!r:.80}: 1-64 characters of a-z, 0-9 and ._:/-")
    if args.capability and not registries:
        raise ConfigError("--capability is published to a registry: add --registry ID@URL")
    allow = _allow(args.allow)
    limits = mcp.Limits(calls_per_peer=args.calls_per_peer, calls_total=args.calls_total)
    listen = checks.listen_urls(args.listen)
    handlers = max(64, limits.calls_total + limits.listens_total)  # each call holds a handler
    config = NodeConfig(transport=transport_config(args), max_handlers=handlers)
    node = Node(identity, listen=listen, config=mcp.announce(config))
    with checks.listen_errors(listen):
        await node.start()
    for gateway in args.trust_gateway:
        checks.agent_id("--trust-gateway", gateway)
    bridge = mcp.StdioBridge(
        node, argv, allow=allow, limits=limits, init_timeout=args.init_timeout,
        trusted_gateways=args.trust_gateway,
    )  # fmt: skip
    try:
        await bridge.start()
        async with contextlib.AsyncExitStack() as stack:
            if registries:
                from iac.mesh import MeshClient

                mesh = MeshClient(node, registries=registries, capabilities=args.capability)
                await stack.enter_async_context(mesh)
                await mcp.publish_tools(mesh, await bridge.tool_names())
            print(f"node {identity.agent_id}", flush=True)
            print_listening(node.addresses)
            print(f"tools {len(await bridge.tool_names())}", flush=True)
            stop = asyncio.ensure_future(serve_until_signal())
            await asyncio.wait({stop, bridge.failed}, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            if bridge.failed.done():
                await bridge.settle(2.0)  # the calls in flight are answered before the node closes
                raise bridge.failed.result()
            print(f"stats {json.dumps(bridge.stats(), sort_keys=True)}", flush=True)
    finally:
        await node.close()  # first: it drains the answers still on their way to the callers
        await bridge.stop()
    return 0


async def run_connect(args: argparse.Namespace) -> int:
    checks.agent_id("--to", args.to)
    mcp = _mcp()
    import mcp_types
    from mcp.server.stdio import stdio_server
    from mcp.shared.message import SessionMessage

    identity = checks.load_key(args.key)
    node = Node(identity, config=NodeConfig(transport=transport_config(args)))
    if args.addr:
        node.add_peer(args.to, *args.addr)
    said: list[str] = []

    def gone(exc: BaseException) -> None:
        if not said:  # one line, however many calls fail
            said.append(str(exc))
            print_error("mcp connect", f"the remote agent {args.to[:16]}… is gone: {exc}")

    async with node:
        transport = mcp.McpClientTransport(
            node, args.to, timeout=args.timeout, call_timeout=args.call_timeout,
            check_capability=False, on_unreachable=gone,
        )  # fmt: skip
        try:
            await transport.check()
        except IacError as exc:
            if exc.reason == "mcp_unsupported":
                raise
            gone(exc)
        async with transport as (iac_read, iac_write), stdio_server() as (host_read, host_write):

            async def host_to_agent() -> None:
                async for item in host_read:
                    if isinstance(item, Exception):  # a line that is not JSON-RPC
                        error = mcp_types.JSONRPCError(
                            jsonrpc="2.0",
                            id=None,
                            error=mcp_types.ErrorData(code=-32700, message="parse error"),
                        )
                        await host_write.send(SessionMessage(error))
                        continue
                    await iac_write.send(item)

            async def agent_to_host() -> None:
                async for item in iac_read:
                    if not isinstance(item, Exception):
                        await host_write.send(item)

            back = asyncio.ensure_future(agent_to_host())
            try:
                await host_to_agent()  # until the host closes stdin
            finally:
                back.cancel()
                await asyncio.gather(back, return_exceptions=True)
    return 0


def _run(main: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        return int(asyncio.run(main(args)))

    return run


def register(sub: Any) -> None:
    """Add ``iac mcp serve|connect`` to the ``iac`` sub-command parsers."""
    p = sub.add_parser("mcp", help="MCP over IAC: a stdio MCP server on the mesh, or a host's way to one")
    verbs = p.add_subparsers(dest="mcp_verb", metavar="VERB", required=True)

    s = verbs.add_parser(
        "serve",
        help="answer MCP over IAC for a stdio MCP server: iac mcp serve --key K --listen URL --stdio -- CMD",
    )
    s.add_argument("--key", required=True, help="the node's key file")
    add_listen_option(s)
    s.add_argument("--stdio", action="store_true", help="run CMD ARGS (after --) as a stdio MCP server")
    s.add_argument(
        "--calls-per-peer",
        type=integer(minimum=1, what="number of calls"),
        default=DEFAULTS["calls_per_peer"],
        help="calls in flight one calling agent may have (default 8); more get error -32050",
    )
    s.add_argument(
        "--calls-total",
        type=integer(minimum=1, what="number of calls"),
        default=DEFAULTS["calls_total"],
        help="calls in flight in all (default 48); more get error -32050",
    )
    s.add_argument(
        "--init-timeout",
        type=seconds(example="10"),
        default=DEFAULTS["init_timeout"],
        help="seconds the stdio server has to answer initialize (default 10)",
    )
    s.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="AGENT=TOOLS",
        help="tools AGENT may call, comma-separated (* for any agent or any tool; default: all to all)",
    )
    s.add_argument(
        "--trust-gateway",
        action="append",
        default=[],
        metavar="AGENT",
        help="believe this gateway's principal (field 19); from others a principal is refused",
    )
    add_registry_option(s, "publish the node, mcp/1 and its tools to the registry AGENT_ID@ADDRESS")
    s.add_argument(
        "--capability", action="append", default=[], help="a capability to publish (with --registry)"
    )
    add_transport_options(s)
    s.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ARGS", help="the stdio MCP server")
    s.set_defaults(func=_run(run_serve))

    c = verbs.add_parser("connect", help="a stdio MCP server for MCP hosts that forwards to an IAC agent")
    c.add_argument("--key", required=True, help="the key file the calls are signed with")
    c.add_argument("--to", required=True, metavar="AGENT", help="the agent's AgentId")
    c.add_argument("--addr", action="append", default=[], metavar="URL", help="an address of the agent")
    c.add_argument(
        "--timeout",
        type=seconds(example="30"),
        default=30.0,
        help="seconds a notification may take (default 30)",
    )
    c.add_argument(
        "--call-timeout",
        type=seconds(example="300"),
        default=300.0,
        help="seconds a request may take in all (default 300)",
    )
    add_transport_options(c)
    c.set_defaults(func=_run(run_connect))


__all__ = ["DEFAULTS", "register", "run_connect", "run_serve"]
