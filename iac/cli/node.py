"""``iac node``: run a :class:`~iac.Node` until interrupted.

``iac node --key K --listen URL [--listen URL ...]`` runs a node that answers PING and
refuses at once what it has no handler for (a request or a remote call: ERROR ``no_handler``;
a file: ``no_handler`` too, it has no inbox), as any node does. It prints its AgentId and each
address it listens on (with the port resolved), one per line, then serves until interrupted.

``--inbox DIR`` makes it take files sent with ``iac send-file`` into ``DIR`` (``--max-file-size``
bounds them): it prints ``inbox DIR`` after the addresses and one
``received NAME SIZE sha256=… from ID`` line per file.

``--registry ID@URL`` makes it publish itself (``--alias``, ``--capability``, ``--ttl``) before
it prints anything, and keep its record fresh. A ``--registry`` that is not a registry, or
that cannot be reached, ends it with one line on stderr.

Errors are one line on stderr and a non-zero exit (``iac.cli.main.main``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from typing import Any

from iac.cli.files import inbox_options, print_received
from iac.cli.options import (
    add_listen_option,
    add_registry_option,
    add_tls_options,
    node_default,
    print_listening,
    serve_until_signal,
    transport_config,
)
from iac.errors import ConfigError, ErrorCode, RemoteError
from iac.mesh import MeshClient, parse_registry
from iac.node.config import NodeConfig
from iac.node.node import Node
from iac.wire.identity import Identity


async def run_node(args: argparse.Namespace) -> int:
    """``iac node``: a :class:`~iac.Node` on ``args.listen``, with the inbox (``args.inbox``)
    and the registries (``args.registry``) it is given; serves until SIGINT or SIGTERM."""
    identity = Identity.load(args.key)
    registries = parse_registry(args.registry or ())
    if not registries and (args.alias or args.capability):
        raise ConfigError("--alias and --capability are published to a registry: they need --registry")
    config = NodeConfig(transport=transport_config(args), **inbox_options(args))
    async with Node(identity, listen=args.listen, config=config) as node:
        if args.inbox is not None:
            node.on_file(print_received)
        async with contextlib.AsyncExitStack() as stack:
            if registries:
                mesh = MeshClient(
                    node,
                    registries=registries,
                    aliases=args.alias,
                    capabilities=args.capability,
                    ttl=args.ttl,
                )
                try:
                    await stack.enter_async_context(mesh)
                except RemoteError as exc:
                    if exc.code != ErrorCode.NO_HANDLER.value:
                        raise
                    named = " ".join(args.registry)
                    raise ConfigError(f"--registry {named}: not a registry (it answered {exc})") from None
            print(f"node {identity.agent_id}", flush=True)
            print_listening(node.addresses)
            if args.inbox is not None:
                print(f"inbox {args.inbox}", flush=True)
            await serve_until_signal()
    return 0


def _cmd_node(args: argparse.Namespace) -> int:
    return asyncio.run(run_node(args))


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``node`` to the ``iac`` parser."""
    p = sub.add_parser("node", help="run a node (answers PING; takes files with --inbox)")
    p.add_argument("--key", required=True, help="agent key file")
    add_listen_option(p)
    add_registry_option(
        p, "publish this node to the registry AGENT_ID@ADDRESS and keep it fresh (repeatable)"
    )
    p.add_argument("--alias", action="append", default=[], help="alias to register (with --registry)")
    p.add_argument("--capability", action="append", default=[], help="capability to offer (with --registry)")
    p.add_argument(
        "--ttl", type=float, default=600.0, help="record lifetime in seconds (default %(default)g)"
    )
    p.add_argument(
        "--inbox", default=None, metavar="DIR", help="take files sent with `iac send-file` into DIR"
    )
    p.add_argument(
        "--max-file-size",
        type=int,
        default=None,
        metavar="BYTES",
        help=f"largest file taken, with --inbox (default {node_default('max_file_size')})",
    )
    add_tls_options(p)
    p.set_defaults(func=_cmd_node)


__all__ = ["register", "run_node"]
