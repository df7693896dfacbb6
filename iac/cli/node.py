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

``--nat`` composes NAT traversal (:class:`~iac.mesh.Traversal`): the node learns the address
the registry sees it at, publishes its candidates in its record (``--no-lan-addresses`` keeps
private ones out), prints one ``candidate KIND VALUE`` line per candidate after its addresses,
and answers punch requests from peers that share a relay with it; ``iac status`` shows them.
``--punch ID`` (with ``--nat`` and a ``--registry`` that relays, ``iac registry --relay``) makes
it start the punches itself: it reaches that peer through the first registry and keeps trying to
upgrade to a direct QUIC path (:meth:`~iac.mesh.Traversal.watch`, with backoff), again whenever
the direct path dies.

It serves its status to ``iac status`` on a private UNIX socket (``--admin PATH``; by default
``$XDG_RUNTIME_DIR/iac/ID.sock`` or ``~/.iac/run/ID.sock``; ``--no-admin`` for none) and prints
``status PATH``; ``--metrics HOST:PORT`` serves Prometheus metrics and prints ``metrics URL``.
``-v``/``-vv`` and ``--log-format json`` set up its logging (:mod:`iac.cli.logs`).

Errors are one line on stderr and a non-zero exit (``iac.cli.main.main``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from typing import Any

from iac.cli import checks
from iac.cli.files import inbox_options, print_received
from iac.cli.options import (
    MAX_LIFETIME,
    add_listen_option,
    add_registry_option,
    add_server_options,
    add_transport_options,
    integer,
    node_default,
    print_listening,
    seconds,
    serve_until_signal,
    transport_config,
)
from iac.cli.serving import metrics_of, print_lines, running
from iac.errors import ConfigError, ErrorCode, RemoteError
from iac.mesh import MeshClient, Traversal
from iac.node.config import NodeConfig
from iac.node.node import Node
from iac.protocol.records import is_alias, is_capability
from iac.wire.identity import is_agent_id


def _check_publish(args: argparse.Namespace, has_registry: bool) -> None:
    if args.punch and not (args.nat and has_registry):
        raise ConfigError(
            "--punch starts hole punches through a registry that relays: add --nat and --registry"
        )
    for peer in args.punch:
        if not is_agent_id(peer):
            raise ConfigError(f"--punch {peer!r:.80}: not an AgentId (64 lowercase hex digits)")
    if not has_registry and (args.alias or args.capability):
        raise ConfigError("--alias and --capability are published to a registry: add --registry ID@URL")
    for alias in args.alias:
        if not is_alias(alias):
            raise ConfigError(
                f"--alias {alias!r:.80}: an alias is lowercase labels of a-z, 0-9 and '-', joined by dots "
                "(e.g. writer.team-a)"
            )
    for cap in args.capability:
        if not is_capability(cap):
            raise ConfigError(
                f"--capability {cap!r:.80}: a capability is 1-64 characters of a-z, 0-9 and ._:/- starting "
                "with a letter or digit (e.g. write)"
            )


async def run_node(args: argparse.Namespace) -> int:
    """``iac node``: a :class:`~iac.Node` on ``args.listen``, with the inbox (``args.inbox``)
    and the registries (``args.registry``) it is given; serves until SIGINT or SIGTERM."""
    identity = checks.load_key(args.key)
    registries = checks.registries(args.registry or ())
    _check_publish(args, bool(registries))
    listen = checks.listen_urls(args.listen)
    tickets = checks.tickets_file(args.tickets)
    config = NodeConfig(
        transport=transport_config(args),
        tickets_file=tickets,
        publish_private_addresses=not args.no_lan_addresses,
        max_sessions=args.max_sessions,
        sessions_per_tenant=args.sessions_per_tenant,
        **inbox_options(args),
    )
    metrics = metrics_of(args)
    node = Node(identity, listen=listen, config=config, metrics=metrics)
    with checks.listen_errors(listen, metrics=getattr(args, "metrics", None)):
        await node.start()
    try:
        if args.inbox is not None:
            node.on_file(print_received)
        async with contextlib.AsyncExitStack() as stack:
            traversal = Traversal(node) if args.nat else None
            if traversal is not None:
                stack.push_async_callback(traversal.close)
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
                    raise ConfigError(
                        f"--registry {named}: not a registry (it answered {exc}); give the AgentId@URL of "
                        "an `iac registry`"
                    ) from None
                if traversal is not None:
                    for peer in args.punch:  # through the registry, punched for on the way
                        node.add_route(peer, registries[0].agent_id)
                        traversal.watch(peer)
            lines = await stack.enter_async_context(running(node, args, metrics))
            print(f"node {identity.agent_id}", flush=True)
            print_listening(node.addresses)
            for kind, value in traversal.candidates() if traversal is not None else ():
                print(f"candidate {kind} {value}", flush=True)
            if args.inbox is not None:
                print(f"inbox {args.inbox}", flush=True)
            print_lines(lines)
            await serve_until_signal()
    finally:
        await node.close()
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
        "--ttl",
        type=seconds(maximum=MAX_LIFETIME, example="600"),
        default=600.0,
        help="record lifetime in seconds, at most a year (default %(default)g)",
    )
    p.add_argument(
        "--nat",
        action="store_true",
        help="NAT traversal: learn the address the registry sees, publish candidates, answer punches",
    )
    p.add_argument(
        "--punch",
        action="append",
        default=[],
        metavar="ID",
        help="with --nat: reach the peer ID through the first --registry (which must relay) and "
        "keep punching for a direct path to it, with backoff (repeatable)",
    )
    p.add_argument(
        "--no-lan-addresses",
        action="store_true",
        help="keep private, loopback and link-local addresses out of the published record",
    )
    p.add_argument(
        "--inbox", default=None, metavar="DIR", help="take files sent with `iac send-file` into DIR"
    )
    p.add_argument(
        "--max-file-size",
        type=integer(minimum=0, what="size in bytes"),
        default=None,
        metavar="BYTES",
        help=f"largest file taken, with --inbox (default {node_default('max_file_size')})",
    )
    p.add_argument(
        "--tickets",
        default=None,
        metavar="FILE",
        help="keep QUIC session tickets in FILE (mode 0600, secret like a key): a restarted node "
        "resumes its sessions and sends its first messages as 0-RTT early data",
    )
    p.add_argument(
        "--max-sessions",
        type=integer(what="number of sessions"),
        default=node_default("max_sessions"),
        metavar="N",
        help="most sender sessions the replay store tracks; a new one beyond is refused with busy "
        "(default %(default)d)",
    )
    p.add_argument(
        "--sessions-per-tenant",
        type=integer(what="number of sessions"),
        default=None,
        metavar="N",
        help="most of them one sender, or one neighbour with its FORWARDs, may hold; its new session "
        "beyond is refused with busy while others' are admitted (default 1%% of --max-sessions)",
    )
    add_transport_options(p)
    add_server_options(p)
    p.set_defaults(func=_cmd_node)


__all__ = ["register", "run_node"]
