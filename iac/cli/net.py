"""Network verbs of the ``iac`` command: ``ping`` and ``certs init``.

``iac ping --key K --to AGENT_ID --addr URL [--addr URL ...] [--count N]`` dials
the node through the fallback dialer, sends N PINGs one after another and
prints the transport used and the round-trip times (min / median / p99).

``iac certs init [--dir DIR] [--node NAME ...]`` creates a private CA and node certificates
for CA mode (``--ca``, ``--cert``, ``--cert-key``).

Errors (refused, wrong AgentId, no route, timeout) are one line on stderr and
a non-zero exit (``iac.cli.main.main``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Sequence
from typing import Any

from iac.cli.options import add_tls_options, transport_config
from iac.errors import ConfigError, IacError, TransportError
from iac.protocol.clock import now_us
from iac.transport.certs import init_ca
from iac.transport.dialer import Dialer, DialPolicy
from iac.wire.enums import MessageType
from iac.wire.frames import FrameType
from iac.wire.identity import Identity, check_agent_id
from iac.wire.message import Session, build_message, encode_message_frame, open_message, sender_of


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of a non-empty list, ``q`` in 0..100: the smallest value that at
    least ``q`` percent of the values are less than or equal to (0 gives the minimum)."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n * q / 100), the 1-based rank
    return ordered[int(rank) - 1]


# --- iac ping -----------------------------------------------------------------------------------


async def _run_ping(args: argparse.Namespace) -> int:
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
    dialer = Dialer(identity, config=transport_config(args), policy=policy)
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
                        if inc.frame.type != FrameType.MESSAGE:
                            continue
                        r = open_message(inc.frame.body)  # a bad signature raises: one line, exit 1
                        if (
                            int(r.msg_type) == MessageType.REPLY
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
    for path in init_ca(args.dir, args.node or ["node"], overwrite=args.force):
        print(path)
    return 0


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``ping`` and ``certs init`` to the ``iac`` parser."""
    p = sub.add_parser("ping", help="ping a node and print the transport and round-trip times")
    p.add_argument("--key", required=True, help="agent key file")
    p.add_argument("--to", required=True, metavar="AGENT_ID", help="the node's AgentId")
    p.add_argument("--addr", action="append", required=True, metavar="URL", help="node address (repeatable)")
    p.add_argument("--count", type=int, default=10, help="number of PINGs (default %(default)s)")
    p.add_argument(
        "--timeout",
        type=float,
        default=3.0,
        help="seconds per dial attempt and per reply (default %(default)g)",
    )
    p.add_argument("--pin", choices=["quic", "tls", "unix"], default=None, help="use only this transport")
    p.add_argument(
        "--forbid", action="append", choices=["quic", "tls", "unix"], help="never use this transport"
    )
    add_tls_options(p)
    p.set_defaults(func=_cmd_ping)

    p = sub.add_parser("certs", help="CA mode certificates")
    csub = p.add_subparsers(dest="certs_verb", metavar="ACTION", required=True)
    c = csub.add_parser("init", help="create a private CA and node certificates in a folder")
    c.add_argument("--dir", default="certs", help="folder to write (default certs/)")
    c.add_argument("--node", action="append", metavar="NAME", help="node certificate name (repeatable)")
    c.add_argument("--force", action="store_true", help="replace existing files")
    c.set_defaults(func=_cmd_certs_init)


__all__ = ["percentile", "register"]
