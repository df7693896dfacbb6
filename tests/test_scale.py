"""Scale: memory per connected peer, dial bursts, the node's connection bound.

A server node runs in a process of its own (``python -m tools.scale_probe serve``): its
resident set is what is measured, away from this process's clients. Each client peer has
an identity of its own and sends one request, which the server answers, so every
connection carried traffic when the server's memory is read. No timing is asserted.
"""

from __future__ import annotations

import pytest
from conftest import run

from tools.scale_probe import client_config, close_all, open_peers, server

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
