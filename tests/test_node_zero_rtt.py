"""0-RTT that an agent gets from iac.Node: a reconnect resumes the QUIC session and its HELLO and
first messages ride in 0-RTT packets -- checked on the wire, by packet type, through a UDP relay --
after a dropped connection and after the agent restarted (the ticket file); ``early=False`` keeps a
message out of early data."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run

from iac import ConfigError, Identity, Node, NodeConfig
from iac.testing import Captured, UdpRelay, eventually

PAYLOAD = os.urandom(3000).hex()  # 6 KB that do not compress: visible in the packet sizes


def long_header_packets(datagram: bytes) -> Iterator[tuple[int, int]]:
    """(type, length) of each coalesced QUIC v1 long-header packet in a datagram (RFC 9000 17.2):
    type 0 Initial, 1 0-RTT, 2 Handshake, 3 Retry. Stops at a short-header packet."""
    i = 0
    while i < len(datagram) and datagram[i] & 0x80:
        first = datagram[i]
        ptype = (first & 0x30) >> 4
        j = i + 5  # first byte, version
        dcid = datagram[j]
        j += 1 + dcid
        scid = datagram[j]
        j += 1 + scid
        if ptype == 3:  # Retry: the rest of the datagram
            yield ptype, len(datagram) - i
            return
        if ptype == 0:  # Initial: token
            n, j = varint(datagram, j)
            j += n
        length, j = varint(datagram, j)
        yield ptype, j + length - i
        i = j + length


def varint(data: bytes, i: int) -> tuple[int, int]:
    size = 1 << (data[i] >> 6)
    value = data[i] & 0x3F
    for k in range(1, size):
        value = (value << 8) | data[i + k]
    return value, i + size


def zero_rtt_bytes(captured: list[Captured]) -> int:
    return sum(n for c in captured for t, n in long_header_packets(c.data) if t == 1)


def test_a_node_reconnects_with_0rtt_after_a_drop_and_after_a_restart(tmp_path: Path) -> None:
    async def main() -> None:
        tickets = tmp_path / "tickets.json"
        me = Identity.generate()
        async with Node(listen="quic://127.0.0.1:0") as bob:
            got: list[str] = []
            bob.on("RUN")(lambda ctx: got.append(ctx.payload["n"]) or "ok")
            port = int(bob.addresses[0].rsplit(":", 1)[1])
            async with UdpRelay(("127.0.0.1", port)) as relay:
                url = f"quic://127.0.0.1:{relay.address[1]}"

                async def request_once(alice: Node, n: str, *, early: bool = True) -> int:
                    """A request on a fresh connection; the 0-RTT bytes it sent."""
                    relay.start_capture(limit=64)
                    reply = await alice.request(bob.agent_id, "RUN", {"n": n, "pad": PAYLOAD}, timeout=10,
                                                early=early)  # fmt: skip
                    assert reply.payload == "ok"
                    sent = zero_rtt_bytes(relay.stop_capture())
                    conn = alice.connection(bob.agent_id)
                    assert conn is not None
                    await eventually(lambda: url in json.loads(tickets.read_text() or "{}"))  # next ticket
                    await conn.close()
                    await eventually(lambda: not alice.connected(bob.agent_id))
                    return sent

                config = NodeConfig(tickets_file=tickets)
                async with Node(me, config=config) as alice:
                    alice.add_peer(bob.agent_id, url)
                    assert await request_once(alice, "first") == 0  # no ticket yet: 1-RTT
                    assert tickets.stat().st_mode & 0o077 == 0
                    assert await request_once(alice, "after-drop") > len(PAYLOAD)  # HELLO + request early
                    assert await request_once(alice, "held-back", early=False) < len(PAYLOAD) // 2
                    zero = {"resumed": 2, "early_dials": 2, "early_accepted": 2, "early_rejected": 0}
                    assert alice.stats().zero_rtt == zero | {"early_received": 0}
                used = tickets.read_text()
                async with Node(me, config=config) as restarted:  # a new process would read the same file
                    restarted.add_peer(bob.agent_id, url)
                    assert await request_once(restarted, "after-restart") > len(PAYLOAD)
                tickets.write_text(used)  # a ticket the server took already: it refuses the early data
                async with Node(me, config=config) as stale:
                    stale.add_peer(bob.agent_id, url)
                    assert await request_once(stale, "rejected") > len(PAYLOAD)  # sent early, refused,
                    zero = {"resumed": 0, "early_dials": 1, "early_accepted": 0, "early_rejected": 1}
                    assert stale.stats().zero_rtt == zero | {"early_received": 0}
            # each handled once (the rejected request was sent again after the handshake)
            assert got == ["first", "after-drop", "held-back", "after-restart", "rejected"]
            assert bob.stats().zero_rtt == {
                "resumed": 3, "early_dials": 0, "early_accepted": 0, "early_rejected": 0, "early_received": 3
            }  # fmt: skip

    run(main(), timeout=60)


def test_a_cluster_that_shares_tickets_but_not_replay_state_is_refused_at_start(tmp_path: Path) -> None:
    """Servers sharing session tickets resume each other's sessions: without one replay store and
    one HELLO nonce cache, a 0-RTT flight replayed to a second server would run twice."""
    from iac.stores import SqliteReplayStore
    from iac.stores.nonces import SqliteNonceCache
    from iac.stores.tickets import SqliteTicketStore
    from iac.transport import TransportConfig

    async def main() -> None:
        tickets = SqliteTicketStore(tmp_path / "tickets.db")
        nonces = SqliteNonceCache(tmp_path / "nonces.db")
        replay = SqliteReplayStore(tmp_path / "replay.db")
        for transport, store, missing in (
            (TransportConfig(ticket_store=tickets), None, "replay store"),
            (TransportConfig(ticket_store=tickets, nonce_cache=nonces), None, "replay store"),
            (TransportConfig(ticket_store=tickets), replay, "HELLO nonce cache"),
        ):
            node = Node(
                listen="quic://127.0.0.1:0", config=NodeConfig(transport=transport), replay_store=store
            )
            with pytest.raises(ConfigError, match=missing):
                await node.start()
            await node.close()
        config = NodeConfig(transport=TransportConfig(ticket_store=tickets, nonce_cache=nonces))
        async with Node(listen="quic://127.0.0.1:0", config=config, replay_store=replay) as node:
            assert node.addresses  # a properly configured cluster member starts

    run(main())
