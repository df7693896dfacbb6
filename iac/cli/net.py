"""Network verbs of the ``iac`` command: ``node``, ``ping`` and ``certs init``.

``iac node --key K --listen URL [--listen URL ...]`` runs a node that answers
every PING with a REPLY. It prints its AgentId and each address it listens on
(with the port resolved), one per line, then serves until interrupted. With
``--inbox DIR`` it runs a full :class:`~iac.Node` that also takes files sent with
``iac send-file`` into ``DIR`` (``--max-file-size`` bounds them) and prints one
``received NAME SIZE sha256=… from ID`` line per file.

``iac ping --key K --to AGENT_ID --addr URL [--addr URL ...] [--count N]`` dials
the node through the fallback dialer, sends N PINGs one after another and
prints the transport used and the round-trip times (min / median / p99).

Errors (refused, wrong AgentId, no route, timeout) are one line on stderr and
a non-zero exit (``iac.cli.main.main``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import statistics
import time
from typing import Any

from iac.errors import ConfigError, IacError, TransportError


def _config(args: argparse.Namespace, **extra: Any) -> Any:
    from iac.transport.base import TransportConfig

    if args.ca and not (args.cert and args.cert_key):
        raise ConfigError("--ca needs --cert and --cert-key (make them with `iac certs init`)")
    return TransportConfig(
        ca_file=args.ca,
        cert_file=args.cert,
        key_file=args.cert_key,
        **extra,
    )


def _add_tls_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ca", default=None, help="CA mode: CA certificate (PEM) that peers must chain to")
    p.add_argument("--cert", default=None, help="CA mode: this node's certificate (PEM)")
    p.add_argument("--cert-key", default=None, help="CA mode: this node's certificate key (PEM)")


def _add_listen_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--listen",
        action="append",
        required=True,
        metavar="URL",
        help="quic://host:port, tls://host:port or unix:///path (repeatable; port 0 picks one)",
    )


async def _serve_forever() -> None:
    """Wait until SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()


# --- iac node -----------------------------------------------------------------------------------


async def _serve_connection(identity: Any, conn: Any) -> None:
    from iac.protocol.clock import now_us
    from iac.wire._pb.iac_pb2 import MessageType
    from iac.wire.message import Session, build_message, encode_message_frame, sender_of

    session = Session()
    with contextlib.suppress(IacError):
        while True:
            inc = await conn.recv()
            msg = inc.message
            if msg is None or msg.msg_type != MessageType.PING:
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


async def _run_node(args: argparse.Namespace) -> int:
    from iac.transport import listen
    from iac.wire.identity import Identity

    identity = Identity.load(args.key)
    config = _config(args, listen_addrs=tuple(args.listen))

    async def on_connection(conn: Any) -> None:
        await _serve_connection(identity, conn)

    listeners = []
    try:
        for url in args.listen:
            listeners.append(await listen(url, identity, on_connection, config=config))
        print(f"node {identity.agent_id}", flush=True)
        for lst in listeners:
            for addr in lst.addresses:
                print(f"listening {addr}", flush=True)
        await _serve_forever()
    finally:
        for lst in listeners:
            await lst.close()
    return 0


def _cmd_node(args: argparse.Namespace) -> int:
    if args.inbox is not None and not args.registry:  # a full Node that takes files (iac send-file)
        from iac.cli.files import run_inbox_node

        return asyncio.run(run_inbox_node(args))
    if args.registry:
        from iac.cli.mesh import run_mesh_node

        return asyncio.run(run_mesh_node(args))
    return asyncio.run(_run_node(args))


# --- iac ping -----------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


async def _run_ping(args: argparse.Namespace) -> int:
    from iac.protocol.clock import now_us
    from iac.transport.dialer import Dialer, DialPolicy
    from iac.wire._pb.iac_pb2 import MessageType
    from iac.wire.identity import Identity, check_agent_id
    from iac.wire.message import Session, build_message, encode_message_frame, sender_of

    identity = Identity.load(args.key)
    try:
        target = check_agent_id(args.to)
    except IacError:
        raise ConfigError(f"--to {args.to!r} is not an AgentId (64 lowercase hex characters)") from None
    if args.count < 1:
        raise ConfigError("--count must be at least 1")
    policy = DialPolicy(
        pin=args.pin, forbid=frozenset(args.forbid or ()), attempt_timeout=args.timeout, stagger=0.25
    )
    dialer = Dialer(identity, config=_config(args), policy=policy)
    conn = await dialer.dial(args.addr, expect=target)
    session = Session()
    rtts: list[float] = []
    try:
        for _ in range(args.count):
            msg = build_message(
                sender=identity.agent_id,
                to=target,
                msg_type=MessageType.PING,
                session=session,
                timestamp_us=now_us(),
                deadline_us=now_us() + int(args.timeout * 1_000_000),  # a request: it expects a REPLY
            )
            frame = encode_message_frame(identity, msg)
            t0 = time.perf_counter()
            await conn.send(frame)
            try:
                async with asyncio.timeout(args.timeout):
                    while True:
                        inc = await conn.recv()
                        r = inc.message
                        if (
                            r is not None
                            and r.msg_type == MessageType.REPLY
                            and r.reply_to == msg.msg_id
                            and r.reply_session_id == session.session_id
                            and sender_of(r) == target
                        ):
                            break
            except TimeoutError:
                raise TransportError(f"no REPLY within {args.timeout:g} s") from None
            rtts.append((time.perf_counter() - t0) * 1000.0)
    finally:
        await conn.close()
    print(
        f"{conn.peer.transport} {conn.peer.address} {target[:16]}… "
        f"count={len(rtts)} rtt_ms min={min(rtts):.3f} median={statistics.median(rtts):.3f} "
        f"p99={percentile(rtts, 99):.3f}"
    )
    return 0


def _cmd_ping(args: argparse.Namespace) -> int:
    return asyncio.run(_run_ping(args))


# --- iac certs ----------------------------------------------------------------------------------


def _cmd_certs_init(args: argparse.Namespace) -> int:
    from iac.transport.certs import init_ca

    for path in init_ca(args.dir, args.node or ["node"], overwrite=args.force):
        print(path)
    return 0


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the network verbs to the ``iac`` parser."""
    p = sub.add_parser("node", help="run a node that answers PING")
    p.add_argument("--key", required=True, help="agent key file")
    _add_listen_option(p)
    p.add_argument(
        "--registry",
        action="append",
        default=[],
        metavar="ID@URL",
        help="publish this node to the registry AGENT_ID@ADDRESS and keep it fresh (repeatable)",
    )
    p.add_argument("--alias", action="append", default=[], help="alias to register (with --registry)")
    p.add_argument("--capability", action="append", default=[], help="capability to offer (with --registry)")
    p.add_argument("--ttl", type=float, default=600.0, help="record lifetime in seconds (default 600)")
    p.add_argument(
        "--inbox", default=None, metavar="DIR", help="take files sent with `iac send-file` into DIR"
    )
    p.add_argument(
        "--max-file-size", type=int, default=None, metavar="BYTES", help="largest file taken (default 1 GiB)"
    )
    _add_tls_options(p)
    p.set_defaults(func=_cmd_node)

    p = sub.add_parser("ping", help="ping a node and print the transport and round-trip times")
    p.add_argument("--key", required=True, help="agent key file")
    p.add_argument("--to", required=True, metavar="AGENT_ID", help="the node's AgentId")
    p.add_argument("--addr", action="append", required=True, metavar="URL", help="node address (repeatable)")
    p.add_argument("--count", type=int, default=10, help="number of PINGs (default 10)")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds per dial attempt and per reply")
    p.add_argument("--pin", choices=["quic", "tls", "unix"], default=None, help="use only this transport")
    p.add_argument(
        "--forbid", action="append", choices=["quic", "tls", "unix"], help="never use this transport"
    )
    _add_tls_options(p)
    p.set_defaults(func=_cmd_ping)

    p = sub.add_parser("certs", help="CA mode certificates")
    csub = p.add_subparsers(dest="certs_verb", metavar="ACTION", required=True)
    c = csub.add_parser("init", help="create a private CA and node certificates in a folder")
    c.add_argument("--dir", default="certs", help="folder to write (default certs/)")
    c.add_argument("--node", action="append", metavar="NAME", help="node certificate name (repeatable)")
    c.add_argument("--force", action="store_true", help="replace existing files")
    c.set_defaults(func=_cmd_certs_init)


__all__ = ["percentile", "register"]
