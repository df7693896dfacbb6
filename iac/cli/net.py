"""Network verbs of the ``iac`` command: ``ping`` and ``certs init``.

``iac ping --key K --to AGENT_ID --addr URL [--addr URL ...] [--count N]`` dials
the node through the fallback dialer, sends N PINGs one after another and
prints the transport used and the round-trip times (min / median / p99). Stopped
with Ctrl-C, it prints what it measured so far (and exits 130).

``iac certs init [--dir DIR] [--node NAME ...]`` creates a private CA and node certificates
for CA mode (``--ca``, ``--cert``, ``--cert-key``).

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
from collections.abc import Sequence
from typing import Any

from iac.cli import checks
from iac.cli.options import add_transport_options, integer, seconds, transport_config
from iac.errors import ConfigError, TransportError
from iac.protocol.clock import now_us
from iac.transport.base import Connection
from iac.transport.certs import init_ca
from iac.transport.dialer import Dialer, DialPolicy
from iac.wire.enums import MessageType
from iac.wire.frames import FrameType
from iac.wire.identity import Identity
from iac.wire.message import Session, build_message, encode_message_frame, open_message, sender_of

TRANSPORT_NAMES = ("quic", "tls", "unix")


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of a non-empty list, ``q`` in 0..100: the smallest value that at
    least ``q`` percent of the values are less than or equal to (0 gives the minimum)."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n * q / 100), the 1-based rank
    return ordered[int(rank) - 1]


def ping_summary(conn: Connection, target: str, rtts: Sequence[float], asked: int | None = None) -> str:
    """The line ``iac ping`` prints: transport, address, peer, count, min / median / p99 RTT
    (``asked``: how many PINGs were planned, when it stopped early)."""
    head = f"{conn.peer.transport} {conn.peer.address} {target[:16]}… count={len(rtts)}"
    if asked is not None and len(rtts) < asked:
        head += f" of {asked} (interrupted)"
    if not rtts:
        return head + " rtt_ms none"
    return (
        f"{head} rtt_ms min={min(rtts):.3f} median={statistics.median(rtts):.3f} "
        f"p99={percentile(rtts, 99):.3f}"
    )


# --- iac ping -----------------------------------------------------------------------------------


async def _one_ping(
    identity: Identity, conn: Connection, target: str, session: Session, timeout: float
) -> float:
    msg = build_message(
        sender=identity.agent_id,
        to=target,
        msg_type=MessageType.PING,
        session=session,
        timestamp_us=now_us(),
        deadline_us=now_us() + int(timeout * 1_000_000),  # a request: it expects a REPLY
    )
    frame = encode_message_frame(identity, msg)
    t0 = time.perf_counter()
    await conn.send(frame)
    try:
        async with asyncio.timeout(timeout):
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
        raise TransportError(
            f"no REPLY within {timeout:g} s; the node is slow or gone: try a larger --timeout"
        ) from None
    return (time.perf_counter() - t0) * 1000.0


async def _run_ping(args: argparse.Namespace) -> int:
    identity = checks.load_key(args.key)
    target = checks.agent_id("--to", args.to)
    for url in args.addr:
        checks.address("--addr", url)
    forbid = frozenset(args.forbid or ())
    if args.pin is not None and args.pin in forbid:
        raise ConfigError(f"--pin {args.pin} and --forbid {args.pin} leave no transport; drop one of them")
    policy = DialPolicy(pin=args.pin, forbid=forbid, attempt_timeout=args.timeout, stagger=0.25)
    dialer = Dialer(identity, config=transport_config(args), policy=policy)
    conn = await dialer.dial(args.addr, expect=target)
    session = Session()
    rtts: list[float] = []

    async def pings() -> None:
        for _ in range(args.count):
            rtts.append(await _one_ping(identity, conn, target, session, args.timeout))

    loop = asyncio.get_running_loop()
    task = loop.create_task(pings())
    interrupted = False

    def stop() -> None:
        nonlocal interrupted
        interrupted = True
        task.cancel()

    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, stop)
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)
        await conn.close()
    print(ping_summary(conn, target, rtts, args.count), flush=True)
    return 130 if interrupted else 0


def _cmd_ping(args: argparse.Namespace) -> int:
    return asyncio.run(_run_ping(args))


# --- iac certs ----------------------------------------------------------------------------------


def _node_name(name: str) -> str:
    """A ``--node`` name: it becomes the files NAME.pem and NAME.key in ``--dir``."""
    if not name:
        why = "is empty"
    elif "/" in name or "\\" in name:
        why = "contains a path separator (the files go into --dir)"
    elif name.startswith("."):
        why = "starts with '.' (a hidden or relative path)"
    elif name == "ca":
        why = "is the CA's own file name (ca.pem, ca.key)"
    else:
        return name
    raise ConfigError(
        f"--node {name!r:.60}: {why}; give a plain name for NAME.pem and NAME.key, e.g. --node web1"
    )


def _cmd_certs_init(args: argparse.Namespace) -> int:
    names = [_node_name(n) for n in (args.node or ["node"])]
    folder = checks.output_dir("--dir", args.dir)
    try:
        written = init_ca(folder, names, overwrite=args.force)
    except OSError as exc:
        raise ConfigError(
            f"--dir {args.dir}: cannot write there ({exc.strerror}); choose a writable directory"
        ) from None
    for path in written:
        print(path)
    return 0


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``ping`` and ``certs init`` to the ``iac`` parser."""
    p = sub.add_parser("ping", help="ping a node and print the transport and round-trip times")
    p.add_argument("--key", required=True, help="agent key file")
    p.add_argument("--to", required=True, metavar="AGENT_ID", help="the node's AgentId")
    p.add_argument("--addr", action="append", required=True, metavar="URL", help="node address (repeatable)")
    p.add_argument(
        "--count",
        type=integer(minimum=1, maximum=1_000_000, what="number of PINGs"),
        default=10,
        help="number of PINGs (default %(default)s)",
    )
    p.add_argument(
        "--timeout",
        type=seconds(example="3"),
        default=3.0,
        help="seconds per dial attempt and per reply (default %(default)g)",
    )
    p.add_argument("--pin", choices=TRANSPORT_NAMES, default=None, help="use only this transport")
    p.add_argument("--forbid", action="append", choices=TRANSPORT_NAMES, help="never use this transport")
    add_transport_options(p)
    p.set_defaults(func=_cmd_ping)

    p = sub.add_parser("certs", help="CA mode certificates")
    csub = p.add_subparsers(dest="certs_verb", metavar="ACTION", required=True)
    c = csub.add_parser("init", help="create a private CA and node certificates in a folder")
    c.add_argument("--dir", default="certs", help="folder to write (default certs/; created if missing)")
    c.add_argument("--node", action="append", metavar="NAME", help="node certificate name (repeatable)")
    c.add_argument("--force", action="store_true", help="replace existing files")
    c.set_defaults(func=_cmd_certs_init)


__all__ = ["percentile", "ping_summary", "register"]
