"""The fallback dialer: order, stagger, policy, one error listing every attempt."""

from __future__ import annotations

import asyncio
import random
import socket
from pathlib import Path

import pytest
from conftest import TRANSPORT_PARAMS, EchoNode, listen_url, roundtrip, run
from ports import free_udp_port

from iac.errors import ConfigError, TransportError
from iac.transport import dial, listen
from iac.transport.base import Address, Connection, TransportConfig
from iac.transport.dialer import Backoff, Dialer, DialError, DialPolicy
from iac.wire.identity import Identity

FAST = TransportConfig(handshake_timeout=3.0, linger_timeout=0.3)
HAVE_QUIC = "quic" in TRANSPORT_PARAMS


class Recorder:
    """Wraps a dial function and records which addresses were tried."""

    def __init__(self, fakes: dict[str, object] | None = None) -> None:
        self.tried: list[str] = []
        self.fakes = fakes or {}

    async def __call__(
        self, addr: Address, identity: Identity, expect: str | None, config: TransportConfig
    ) -> Connection:
        self.tried.append(addr.scheme)
        fake = self.fakes.get(addr.scheme)
        if fake == "hang":
            await asyncio.Event().wait()
        if fake == "refuse":
            raise TransportError(f"{addr.url}: connection refused")
        return await dial(addr, identity, expect=expect, config=config)


async def node(server: Identity, sockdir: Path) -> tuple[list, list[str]]:
    listeners = [await listen(listen_url("tls", sockdir), server, EchoNode(server), config=FAST)]
    listeners.append(await listen(listen_url("unix", sockdir), server, EchoNode(server), config=FAST))
    return listeners, [a for lst in listeners for a in lst.addresses]


class SilentUdp(asyncio.DatagramProtocol):
    """A UDP port that reads every datagram and never answers (a QUIC server that is gone
    silent, or a firewall that drops): a dial to it can only end by its timeout."""

    def __init__(self) -> None:
        self.datagrams = 0

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.datagrams += 1


def outcomes(dialer: Dialer) -> list[tuple[str, str]]:
    return [(a.transport, a.outcome) for a in dialer.history]


def test_falls_back_to_tls_when_quic_port_is_silent(sockdir: Path) -> None:
    server, client = Identity.generate(), Identity.generate()

    async def main() -> None:
        listeners, addrs = await node(server, sockdir)
        transport, silent = await asyncio.get_running_loop().create_datagram_endpoint(
            SilentUdp, local_addr=("127.0.0.1", 0)
        )
        quic = f"quic://127.0.0.1:{transport.get_extra_info('sockname')[1]}"
        tls = next(a for a in addrs if a.startswith("tls://"))
        rec = Recorder()
        policy = DialPolicy(attempt_timeout=30.0, stagger=0.2)
        dialer = Dialer(client, config=FAST, policy=policy, dial_fn=rec)
        conn = await dialer.dial([quic, tls], expect=server.agent_id)
        assert conn.peer.transport == "tls"
        assert rec.tried == ["quic", "tls"] and silent.datagrams > 0  # QUIC was really tried
        # The QUIC attempt had not ended (no timeout, no failure) when TLS won: the dialer started
        # TLS alongside it after the stagger and cancelled it, instead of waiting for its timeout.
        assert outcomes(dialer) == [("tls", "ok")]
        await roundtrip(conn, client)
        await conn.close()
        # remembered: the next dial goes to TLS first and never waits for QUIC
        assert dialer.remembered(server.agent_id) == tls
        rec.tried.clear()
        conn = await dialer.dial([quic, tls], expect=server.agent_id)
        assert rec.tried == ["tls"]
        await conn.close()
        transport.close()
        for lst in listeners:
            await lst.close()

    run(main())


def test_refusal_moves_on_at_once(sockdir: Path) -> None:
    server, client = Identity.generate(), Identity.generate()

    async def main() -> None:
        listeners, addrs = await node(server, sockdir)
        rec = Recorder({"quic": "refuse"})
        hour = 3600.0  # a dial that waited for the stagger after the refusal could not finish
        dialer = Dialer(client, config=FAST, policy=DialPolicy(stagger=hour), dial_fn=rec)
        try:
            conn = await asyncio.wait_for(
                dialer.dial(["quic://127.0.0.1:9", *addrs], expect=server.agent_id), 10
            )
        except TimeoutError:
            pytest.fail("after the refusal the dialer waited for the stagger instead of moving on")
        assert conn.peer.transport == "tls" and rec.tried == ["quic", "tls"]
        assert outcomes(dialer) == [("quic", "transport_error"), ("tls", "ok")]
        await conn.close()
        for lst in listeners:
            await lst.close()

    run(main())


def test_quic_forbidden_is_never_tried(sockdir: Path) -> None:
    server, client = Identity.generate(), Identity.generate()

    async def main() -> None:
        listeners, addrs = await node(server, sockdir)
        rec = Recorder({"quic": "hang"})
        dialer = Dialer(client, config=FAST, policy=DialPolicy(forbid=frozenset({"quic"})), dial_fn=rec)
        conn = await dialer.dial([f"quic://127.0.0.1:{free_udp_port()}", *addrs], expect=server.agent_id)
        assert "quic" not in rec.tried
        assert conn.peer.transport == "tls"
        await conn.close()
        pinned = Dialer(client, config=FAST, policy=DialPolicy(pin="unix"), dial_fn=rec)
        rec.tried.clear()
        conn = await pinned.dial(["quic://127.0.0.1:9", *addrs], expect=server.agent_id)
        assert rec.tried == ["unix"] and conn.peer.transport == "unix"
        await conn.close()
        with pytest.raises(DialError, match="policy"):
            await Dialer(client, policy=DialPolicy(pin="quic")).dial(addrs, expect=server.agent_id)
        for lst in listeners:
            await lst.close()

    run(main())


def test_all_fail_one_error_lists_every_attempt(sockdir: Path) -> None:
    server, client, other = Identity.generate(), Identity.generate(), Identity.generate()

    async def main() -> None:
        listeners, addrs = await node(server, sockdir)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            closed_port = s.getsockname()[1]
        rec = Recorder({"quic": "hang"})
        policy = DialPolicy(attempt_timeout=0.5, stagger=0.1)
        dialer = Dialer(client, config=FAST, policy=policy, dial_fn=rec)
        targets = ["quic://[::1]:9", f"tls://127.0.0.1:{closed_port}", *addrs]
        with pytest.raises(DialError) as info:
            await dialer.dial(targets, expect=other.agent_id)  # wrong id everywhere
        err = info.value
        outcomes = {a.url: a.outcome for a in err.attempts}
        assert outcomes["quic://[::1]:9"] == "timeout"
        assert outcomes[f"tls://127.0.0.1:{closed_port}"] == "transport_error"
        for a in addrs:
            assert outcomes[a] == "wrong_peer"
        assert "\n" not in str(err) and "refused" in str(err)
        assert isinstance(err, TransportError)
        for lst in listeners:
            await lst.close()

    run(main())


def test_ipv6_and_unix_addresses(sockdir: Path) -> None:
    server, client = Identity.generate(), Identity.generate()

    async def main() -> None:
        try:
            lst = await listen("tls://[::1]:0", server, EchoNode(server), config=FAST)
        except TransportError:
            pytest.skip("no IPv6 loopback here")
        async with lst:
            assert lst.addresses[0].startswith("tls://[::1]:")
            conn = await Dialer(client, config=FAST).dial(lst.addresses, expect=server.agent_id)
            await roundtrip(conn, client)
            await conn.close()

    run(main())


def test_policy_validation() -> None:
    with pytest.raises(ConfigError):
        DialPolicy(pin="carrier-pigeon")
    with pytest.raises(ConfigError):
        DialPolicy(attempt_timeout=0)


def test_backoff() -> None:
    b = Backoff(initial=0.1, maximum=1.0, factor=2.0, jitter=0.0)
    assert [b.next_delay() for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    b.reset()
    assert b.next_delay() == 0.1
    j = Backoff(initial=1.0, jitter=0.5, rng=random.Random(1))
    assert all(0.5 <= j.next_delay() / (2**i) <= 1.0 for i in range(5))
