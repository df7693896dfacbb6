"""``iac status``: what a node running on this machine is doing, read from its status socket.

``iac status [--admin PATH] [--json] [--watch SECONDS]`` asks the node serving ``PATH`` (by
default the one socket in ``$XDG_RUNTIME_DIR/iac`` or ``~/.iac/run``; name one with ``--admin``
when several nodes run) and prints its peers (AgentId prefix, transport, path: direct or
relayed, address, RTT, in flight), queue depths, refusals by reason, connections and NAT
traversal (punches, this node's candidates); ``--json`` prints the node's whole answer (one
JSON object: ``agent_id``, ``addresses``, ``pid``, ``uptime_s`` and ``stats``, which is
``node.stats()``). ``--watch N`` prints it again every N seconds until Ctrl-C.

The socket is private to the node's user (:mod:`iac.integrations.admin`): run ``iac status`` as
that user.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from iac.cli.options import seconds
from iac.errors import ConfigError
from iac.integrations.admin import fetch_status, runtime_dir

#: Queue depths shown, in order: (stats key, label).
QUEUES = (
    ("running", "running"),
    ("backlog", "backlog"),
    ("ordered_queued", "ordered"),
    ("reorder_held", "reorder_held"),
    ("pending_requests", "pending"),
    ("unacked", "unacked"),
    ("answer_cache", "answer_cache"),
)
#: Counters shown on the ``messages`` line.
COUNTERS = ("sent", "received", "handled", "replies_sent", "acks_sent", "retransmits", "delivery_failures")


def find_socket(path: str | None) -> Path:
    """The socket to ask: ``path``, else the only one in the runtime directory."""
    if path is not None:
        p = Path(path)
        if p.is_dir():
            raise ConfigError(
                f"--admin {path}: is a directory; give the node's socket "
                "(the `status PATH` line `iac node` prints)"
            )
        return p
    d = runtime_dir()
    found = sorted(d.glob("*.sock")) if d.is_dir() else []
    if not found:
        raise ConfigError(
            f"no status socket in {d}; start a node (`iac node` serves one) or give --admin PATH "
            "(the `status PATH` line the node printed)"
        )
    if len(found) > 1:
        names = ", ".join(p.name for p in found[:8])
        raise ConfigError(f"several nodes run here ({names}); choose one with --admin {d}/NAME.sock")
    return found[0]


def _rtt(value: Any) -> str:
    return "-" if value is None else f"{float(value):.3f}"


def render(answer: Mapping[str, Any]) -> str:
    """The text ``iac status`` prints for a node's answer."""
    stats: Mapping[str, Any] = answer.get("stats", {})
    lines = [
        f"node {answer.get('agent_id', '?')}  pid {answer.get('pid', '?')}  "
        f"up {_uptime(answer.get('uptime_s', 0))}",
    ]
    for addr in answer.get("addresses", []):
        lines.append(f"listening {addr}")
    lines.append(f"connections {stats.get('connections', 0)}")
    links: Mapping[str, Mapping[str, Any]] = stats.get("peer_links", {})
    if links:
        lines.append(f"peers {len(links)}")
        lines.append(
            f"  {'PEER':<17} {'TRANSPORT':<9} {'PATH':<7} {'ADDRESS':<28} {'RTT_MS':>9} {'IN_FLIGHT':>9}"
        )
        order = sorted(links.items(), key=lambda kv: (not kv[1].get("connected"), kv[0]))
        for peer, link in order:
            transport = link.get("transport") or ("-" if link.get("connected") else "down")
            lines.append(
                f"  {peer[:16]:<17} {transport:<9} {link.get('path') or '-':<7} "
                f"{(link.get('address') or '-')[:28]:<28} "
                f"{_rtt(link.get('rtt_ms')):>9} {link.get('in_flight', 0):>9}"
            )
    else:
        lines.append("peers 0")
    queues = "  ".join(f"{label} {stats.get(key, 0)}" for key, label in QUEUES)
    lines.append(
        f"queues  {queues}  "
        f"(peaks: backlog {stats.get('backlog_peak', 0)}, running {stats.get('running_peak', 0)})"
    )
    refused: Mapping[str, int] = stats.get("refused", {})
    shown = "  ".join(
        f"{reason} {n}" for reason, n in sorted(refused.items(), key=lambda kv: (-kv[1], kv[0])) if n
    )
    lines.append(f"refused  {shown or 'none'}")
    lines.append("messages  " + "  ".join(f"{k} {stats.get(k, 0)}" for k in COUNTERS))
    zero_rtt: Mapping[str, int] = stats.get("zero_rtt", {})
    if zero_rtt.get("resumed"):
        lines.append("0-RTT  " + "  ".join(f"{k} {v}" for k, v in zero_rtt.items()))
    nat: Mapping[str, Any] = stats.get("nat", {})
    if nat:
        keys = ["punch_attempts", "punch_successes", "punch_failures", "punches_answered"]
        keys += ["direct", "relayed"]
        lines.append("nat  " + "  ".join(f"{k} {nat.get(k, 0)}" for k in keys))
        for kind, value in nat.get("candidates", []):
            lines.append(f"  candidate {kind} {value}")
    state: Mapping[str, int] = stats.get("peer_state", {})
    if state:
        lines.append("peer_state  " + "  ".join(f"{k} {v}" for k, v in state.items()))
    return "\n".join(lines)


def _uptime(value: Any) -> str:
    total = int(float(value or 0))
    h, rest = divmod(total, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def _show(path: Path, as_json: bool, clear: bool) -> None:
    answer = fetch_status(path)
    text = json.dumps(answer, sort_keys=True) if as_json else render(answer)
    if clear:
        sys.stdout.write("\x1b[H\x1b[2J")
    print(text, flush=True)


def _cmd_status(args: argparse.Namespace) -> int:
    path = find_socket(args.admin)
    if args.watch is None:
        _show(path, args.json, clear=False)
        return 0
    clear = sys.stdout.isatty() and not args.json
    try:
        while True:
            _show(path, args.json, clear)
            time.sleep(args.watch)
            if not clear and not args.json:
                print(flush=True)
    except KeyboardInterrupt:
        return 0


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``status`` to the ``iac`` parser."""
    p = sub.add_parser("status", help="show a local node's peers, queues and refusals (its status socket)")
    p.add_argument(
        "--admin",
        default=None,
        metavar="PATH",
        help="the node's status socket (default: the only one in $XDG_RUNTIME_DIR/iac or ~/.iac/run)",
    )
    p.add_argument("--json", action="store_true", help="print the node's answer as one JSON object")
    p.add_argument(
        "--watch",
        type=seconds(maximum=86400.0, example="2"),
        default=None,
        metavar="SECONDS",
        help="print it again every SECONDS until Ctrl-C",
    )
    p.set_defaults(func=_cmd_status)


__all__ = ["find_socket", "register", "render"]
