"""Scale probes: single measurements beside the scale scenario (iac/bench/scenarios/scale.py), whose
server and client processes they drive, and the in-process client peers tests use.

.venv/bin/python -m tools.scale_probe memory --transport tls --peers 1000 [--base 50] [--procs 4]
.venv/bin/python -m tools.scale_probe burst --transport quic --dials 1000 [--procs 4]
.venv/bin/python -m tools.scale_probe bytes [CORPUS.jsonl]

``memory``: the server's RSS growth per added peer between ``--base`` and ``--peers`` peers (64
dials at a time per client process); ``burst``: one burst of dials arriving at once; ``bytes``:
the mean signed MESSAGE frame over a corpus with the shipped dictionary alone, a per-connection
derived dictionary, and the prefix elided (docs/PROTOCOL.md, section 5).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from iac.bench.scenarios.scale import (
    CORPUS,
    Server,
    _burst,
    _release,
    _spread,
    client_config,
    live_rss,
    open_peer,
    probe_bytes,
    request,
    serve,
    server,
)
from iac.transport.base import Connection, TransportConfig


async def open_peers(
    url: str, server_id: str, n: int, config: TransportConfig, *, at_once: int | None = None
) -> tuple[list[Connection], list[float], list[BaseException], int]:
    """``n`` peers via :func:`open_peer`, ``at_once`` at a time (None: all at once): the
    connections, each one's time from its first attempt, the failures, the retries made."""
    gate = asyncio.Semaphore(at_once or n)

    async def one() -> tuple[Connection, float, int]:
        async with gate:
            return await open_peer(url, server_id, config)

    results = await asyncio.gather(*(one() for _ in range(n)), return_exceptions=True)
    conns = [r[0] for r in results if isinstance(r, tuple)]
    times = [r[1] for r in results if isinstance(r, tuple)]
    errors = [r for r in results if isinstance(r, BaseException)]
    retries = sum(r[2] - 1 for r in results if isinstance(r, tuple))
    return conns, times, errors, retries


async def close_all(conns: Sequence[Connection]) -> None:
    await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)


async def probe_memory(transport: str, peers: int, base: int, procs: int) -> dict[str, Any]:
    async with server([f"{transport}://127.0.0.1:0"]) as srv:
        url = srv.address(transport)
        first, c1 = await _spread(url, srv.agent_id, base, procs, 64)
        rss0 = await srv.rss()
        more, c2 = await _spread(url, srv.agent_id, peers - base, procs, 64)
        rss1 = await srv.rss()
        failed = sum(r["failed"] for r in first + more)
        retries = sum(r["retries"] for r in first + more)
        await _release(c1 + c2)
    added = sum(r["ok"] for r in more)  # the peers that connected between the two readings
    return {
        "transport": transport,
        "peers": peers,
        "rss_base_mib": rss0 / 2**20,
        "rss_mib": rss1 / 2**20,
        "per_peer_kib": (rss1 - rss0) / max(1, added) / 1024,
        "failed": failed,
        "retries": retries,
    }


async def probe_burst(transport: str, dials: int, procs: int) -> dict[str, Any]:
    async with server([f"{transport}://127.0.0.1:0"]) as srv:
        url = srv.address(transport)
        cpu0 = (await srv.command("stats"))["cpu_s"]
        t0 = time.monotonic()
        reports, children = await _spread(url, srv.agent_id, dials, procs, None)
        wall = time.monotonic() - t0
        cpu1 = (await srv.command("stats"))["cpu_s"]
        await _release(children)
    return {"transport": transport, "dials": dials, "server_cpu_s": cpu1 - cpu0, **_burst(reports, wall)}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.scale_probe", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("memory", help="server RSS growth per added peer")
    m.add_argument("--transport", choices=("tls", "quic", "unix"), default="tls")
    m.add_argument("--peers", type=int, default=1000)
    m.add_argument("--base", type=int, default=50, help="peers connected before the first reading (50)")
    m.add_argument("--procs", type=int, default=4, help="client processes (4)")
    b = sub.add_parser("burst", help="dials arriving at once")
    b.add_argument("--transport", choices=("tls", "quic"), default="quic")
    b.add_argument("--dials", type=int, default=1000)
    b.add_argument("--procs", type=int, default=4, help="client processes (4)")
    y = sub.add_parser("bytes", help="mean signed MESSAGE frame over a corpus")
    y.add_argument("corpus", nargs="?", type=Path, default=CORPUS)
    args = ap.parse_args(argv)
    out: Any
    if args.cmd == "memory":
        out = asyncio.run(probe_memory(args.transport, args.peers, args.base, args.procs))
    elif args.cmd == "burst":
        out = asyncio.run(probe_burst(args.transport, args.dials, args.procs))
    else:
        out = probe_bytes(args.corpus)
    print(json.dumps(out, indent=1))
    return 0


__all__ = [
    "Server",
    "client_config",
    "close_all",
    "live_rss",
    "main",
    "open_peer",
    "open_peers",
    "probe_burst",
    "probe_bytes",
    "probe_memory",
    "request",
    "serve",
    "server",
]

if __name__ == "__main__":
    sys.exit(main())
