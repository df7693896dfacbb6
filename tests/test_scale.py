"""Scale: memory per connected peer, dial bursts, the node's connection bound.

A server node runs in a process of its own (``python -m iac.bench.scenarios.scale serve``): its
resident set is what is measured, away from this process's clients. Each client peer has
an identity of its own and sends one request, which the server answers, so every
connection carried traffic when the server's memory is read. No timing is asserted.
"""

from __future__ import annotations

import asyncio
import subprocess
from typing import Any

import pytest
from conftest import run

from iac.errors import ConfigError, DialError
from iac.transport.base import TransportConfig
from iac.transport.bound import DEFAULT_MAX_CONNECTIONS, FD_RESERVE, ConnectionBound
from iac.transport.dialer import Dialer, DialPolicy
from iac.wire.identity import Identity
from tools.scale_probe import Server, client_config, close_all, open_peers, server

#: Server memory per connected peer, at most (docs/THREAT_MODEL.md, "Connections"): with
#: elided from/to a peer holds no dictionary of its own (measured: ~108 KiB TLS, ~116 KiB QUIC).
PER_PEER_BOUND = {"tls": 160 * 1024, "quic": 192 * 1024}
BASE, ADDED = 20, 200


@pytest.mark.parametrize("transport", ["tls", "quic"])
def test_memory_per_peer_stays_under_its_bound(transport: str) -> None:
    async def main() -> None:
        async with server([f"{transport}://127.0.0.1:0"]) as srv:
            url, config = srv.address(transport), client_config()
            held, _, errors, _ = await open_peers(url, srv.agent_id, BASE, config, at_once=32)
            try:
                assert errors == []
                before = await srv.rss()
                more, _, errors, _ = await open_peers(url, srv.agent_id, ADDED, config, at_once=32)
                held += more
                assert errors == []
                after = await srv.rss()
                assert (await srv.command("stats"))["connections"] == BASE + ADDED
            finally:
                await close_all(held)
        per_peer = (after - before) / ADDED
        assert 0 < per_peer <= PER_PEER_BOUND[transport], f"{per_peer / 1024:.0f} KiB per peer"

    run(main(), timeout=60)


def test_connection_bound_counts_and_logs_refusals_once_per_interval() -> None:
    bound = ConnectionBound(3, nofile=64 + 2)  # two descriptors' worth of stream connections
    assert bound.limit(fd=True) == 2 and bound.limit(fd=False) == 3
    assert bound.try_take(fd=True) and bound.try_take(fd=True) and not bound.try_take(fd=True)
    assert bound.try_take(fd=False) and not bound.try_take(fd=False)  # 3 held in all
    bound.give(fd=True)
    assert bound.try_take(fd=True) and bound.held == 3
    # refusals: the first is logged at once, then one line per LOG_INTERVAL_S with the count
    logged = [bound.refused(now) for now in (100.0, 101.0, 105.0, 109.9, 110.0, 111.0)]
    assert logged == [1, 0, 0, 0, 4, 0] and bound.refusals == 6
    with pytest.raises(ConfigError):
        ConnectionBound(0)
    assert TransportConfig().max_connections == DEFAULT_MAX_CONNECTIONS > 10_000


async def _held(srv: Server, n: int) -> None:
    """Wait (at most 10 s) until the server holds ``n`` connections."""
    deadline = asyncio.get_running_loop().time() + 10
    while (held := (await srv.command("stats"))["held"]) != n:
        assert asyncio.get_running_loop().time() < deadline, f"server holds {held}, not {n}"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("transport", ["tls", "quic"])
def test_over_the_bound_dials_get_busy_and_the_node_goes_on(transport: str) -> None:
    """TLS: a real process under a lowered RLIMIT_NOFILE (its bound is the limit less 64);
    QUIC (no descriptor per connection): ``max_connections``."""
    limit = 24
    spec: dict[str, Any] = (
        {"rlimit_nofile": FD_RESERVE + limit}
        if transport == "tls"
        else {"transport": {"max_connections": limit}}
    )

    async def main() -> bytes:
        async with server([f"{transport}://127.0.0.1:0"], stderr=subprocess.PIPE, **spec) as srv:
            url, config = srv.address(transport), client_config(handshake_timeout=10.0)
            held, _, errors, _ = await open_peers(url, srv.agent_id, limit, config, at_once=8)
            try:
                assert errors == []
                await _held(srv, limit)
                for _ in range(5):
                    dialer = Dialer(Identity.generate(), config, DialPolicy(attempt_timeout=10.0))
                    with pytest.raises(DialError, match="busy: the node holds its bound of 24 connections"):
                        await dialer.dial([url], expect=srv.agent_id)
                # the connections it holds are served as before
                for conn in held[:3]:
                    assert conn.peer.agent_id == srv.agent_id and not conn.closed
                await close_all(held[:4])
                await _held(srv, limit - 4)
                again, _, errors, _ = await open_peers(url, srv.agent_id, 4, config)  # room again
                assert errors == [] and len(again) == 4
                held = held[4:] + again
                await _held(srv, limit)
            finally:
                await close_all(held)
        assert srv.proc.stderr is not None
        return await srv.proc.stderr.read()

    log = run(main(), timeout=60).decode()
    lines = [line for line in log.splitlines() if "busy: the node holds" in line]
    assert len(lines) == 1 and "refused 1 " in lines[0], log  # the next 4 wait for the next line


BURST = 256


@pytest.mark.parametrize("transport", ["tls", "quic"])
def test_a_burst_of_dials_all_complete(transport: str) -> None:
    """256 dials arriving at once, at the server's default configuration: every one gets its
    request answered (clients retry a failed attempt with backoff and jitter); no timing."""

    async def main() -> None:
        async with server([f"{transport}://127.0.0.1:0"], transport={"idle_timeout": 30.0}) as srv:
            conns, _, errors, _ = await open_peers(
                srv.address(transport), srv.agent_id, BURST, client_config()
            )
            try:
                assert errors == [] and len(conns) == BURST
                await _held(srv, BURST)
            finally:
                await close_all(conns)

    run(main(), timeout=60)
