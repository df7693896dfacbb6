"""``iac node``: run a node, in one of three modes.

``iac node --key K --listen URL [--listen URL ...]`` runs a node that answers every PING with a
REPLY. It prints its AgentId and each address it listens on (with the port resolved), one per
line, then serves until interrupted.

With ``--inbox DIR`` it runs a full :class:`~iac.Node` that also takes files sent with
``iac send-file`` into ``DIR`` (``--max-file-size`` bounds them) and prints one
``received NAME SIZE sha256=… from ID`` line per file (:func:`iac.cli.files.run_inbox_node`).

With ``--registry ID@URL`` it runs a full node that publishes itself (``--alias``,
``--capability``, ``--ttl``) and keeps its record fresh (:func:`iac.cli.mesh.run_mesh_node`).

Errors are one line on stderr and a non-zero exit (``iac.cli.main.main``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from typing import Any

from iac.cli.files import run_inbox_node
from iac.cli.mesh import run_mesh_node
from iac.cli.options import (
    add_listen_option,
    add_registry_option,
    add_tls_options,
    node_default,
    print_listening,
    serve_until_signal,
    transport_config,
)
from iac.errors import IacError, MessageRejected
from iac.protocol.clock import now_us
from iac.transport import listen
from iac.transport.base import Connection
from iac.wire.enums import MessageType
from iac.wire.frames import FrameType
from iac.wire.identity import Identity
from iac.wire.message import Session, build_message, encode_message_frame, open_message, sender_of


async def _serve_connection(identity: Identity, conn: Connection) -> None:
    session = Session()
    with contextlib.suppress(IacError):
        while True:
            inc = await conn.recv()
            if inc.frame.type != FrameType.MESSAGE:
                continue
            try:
                msg = open_message(inc.frame.body)
            except MessageRejected:
                continue
            if sender_of(msg) != conn.peer.agent_id or int(msg.msg_type) != MessageType.PING:
                continue
            reply = build_message(
                sender=identity.agent_id,
                to=sender_of(msg),
                msg_type=MessageType.REPLY,
                session=session,
                timestamp_us=now_us(),
                reply_to=msg.msg_id,
                reply_session_id=msg.session_id,
                payload_json=msg.payload_json,
            )
            await conn.send(encode_message_frame(identity, reply))


async def run_ping_node(args: argparse.Namespace) -> int:
    """``iac node`` without ``--inbox`` or ``--registry``: answer PING on every connection."""
    identity = Identity.load(args.key)
    config = transport_config(args, listen_addrs=tuple(args.listen))

    async def on_connection(conn: Connection) -> None:
        await _serve_connection(identity, conn)

    listeners = []
    try:
        for url in args.listen:
            listeners.append(await listen(url, identity, on_connection, config=config))
        print(f"node {identity.agent_id}", flush=True)
        for lst in listeners:
            print_listening(lst.addresses)
        await serve_until_signal()
    finally:
        for lst in listeners:
            await lst.close()
    return 0


def _cmd_node(args: argparse.Namespace) -> int:
    if args.inbox is not None and not args.registry:  # a full Node that takes files (iac send-file)
        return asyncio.run(run_inbox_node(args))
    if args.registry:
        return asyncio.run(run_mesh_node(args))
    return asyncio.run(run_ping_node(args))


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``node`` to the ``iac`` parser."""
    p = sub.add_parser("node", help="run a node that answers PING")
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
        help=f"largest file taken (default {node_default('max_file_size')})",
    )
    add_tls_options(p)
    p.set_defaults(func=_cmd_node)


__all__ = ["register", "run_ping_node"]
