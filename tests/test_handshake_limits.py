"""Handshake limits: a token bucket per source address on every listener, and QUIC Retry.

An open node admits every key, so without a limit a flood of HELLOs from fresh keys costs a
signature check each and fills the nonce cache. The floods here come from 127.0.0.2 (raw
sockets: a TCP connect, a QUIC Initial), the honest peer dials from 127.0.0.1; both are
loopback, so the tests turn ``handshake_limit_local`` on.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from pathlib import Path

import pytest
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from conftest import EchoNode, roundtrip, run

from iac.errors import ConfigError, HandshakeError
from iac.protocol.handshake import ALPN
from iac.testing import eventually
from iac.transport import dial, listen
from iac.transport.base import TransportConfig
from iac.transport.limits import HandshakeLimiter, RetryGate, is_local
from iac.transport.quic import QuicListener
from iac.wire.identity import Identity

FLOOD_SOURCE = "127.0.0.2"


def limited(**kw: object) -> TransportConfig:
    base: dict[str, object] = {
        "handshake_rate": 0.01,
        "handshake_burst": 3,
        "handshake_limit_local": True,
        "linger_timeout": 0.2,
        "handshake_timeout": 3.0,
    }
    base.update(kw)
    return TransportConfig(**base)  # type: ignore[arg-type]


# --- sans-IO ------------------------------------------------------------------------------------


def test_token_bucket_per_source() -> None:
    lim = HandshakeLimiter(rate=2.0, burst=3, max_sources=100, limit_local=True)
    assert [lim.allow("10.0.0.1", 0.0) for _ in range(4)] == [True, True, True, False]
    assert lim.first_refusal("10.0.0.1")
    assert not lim.allow("10.0.0.1", 0.1) and not lim.first_refusal("10.0.0.1")  # one log line per burst
    assert lim.allow("10.0.0.2", 0.1)  # another source has its own bucket
    assert lim.allow("10.0.0.1", 0.5)  # refilled at 2 per second
    assert not lim.allow("10.0.0.1", 0.5)


def test_the_source_table_is_bounded() -> None:
    lim = HandshakeLimiter(rate=1.0, burst=1, max_sources=2, limit_local=True)
    for source in ("a", "b", "c"):
        assert lim.allow(source, 0.0)
    assert len(lim) == 2  # "a", seen least recently, was forgotten
    assert lim.allow("a", 0.0) and not lim.allow("c", 0.0)


def test_local_sources_are_exempt_unless_asked() -> None:
    assert is_local("127.0.0.1") and is_local("::1") and is_local("uid:1000") and not is_local("192.0.2.1")
    lim = HandshakeLimiter(rate=1.0, burst=1, max_sources=10)
    assert all(lim.allow("127.0.0.1", 0.0) for _ in range(10))
    assert HandshakeLimiter(rate=None, burst=1, max_sources=1).allow("192.0.2.1", 0.0)
    with pytest.raises(ConfigError):
        HandshakeLimiter(rate=0.0, burst=1, max_sources=1)


def test_retry_gate() -> None:
    assert RetryGate("always", 10).active(0.0) and not RetryGate("never", 10).active(0.0)
    gate = RetryGate("auto", threshold=10, hold=5.0)
    for i in range(10):
        gate.observe(100.0 + i * 0.01)
    assert not gate.active(100.1)  # 10 per second is not above the threshold
    gate.observe(100.2)
    assert gate.active(100.2) and gate.activations == 1
    assert gate.active(105.1) and not gate.active(105.3)  # held 5 s after the last busy second
    with pytest.raises(ConfigError):
        RetryGate("sometimes", 1)


def test_config_checks_the_limits() -> None:
    with pytest.raises(ConfigError):
        TransportConfig(quic_retry="sometimes")
    with pytest.raises(ConfigError):
        TransportConfig(handshake_rate=-1.0)
    assert TransportConfig(handshake_rate=None).handshake_rate is None


# --- TLS and UNIX ---------------------------------------------------------------------------------


def test_a_tls_flood_from_one_source_is_limited_while_another_source_connects() -> None:
    server, honest = Identity.generate(), Identity.generate()

    async def main() -> None:
        node = EchoNode(server)
        listener = await listen("tls://127.0.0.1:0", server, node, config=limited())
        port = int(listener.addresses[0].rsplit(":", 1)[1])
        loop = asyncio.get_running_loop()
        flood: list[socket.socket] = []
        try:
            for _ in range(10):  # TCP connects: refused before the TLS handshake once over the limit
                s = socket.socket()
                s.setblocking(False)
                s.bind((FLOOD_SOURCE, 0))
                await loop.sock_connect(s, ("127.0.0.1", port))
                flood.append(s)
            await eventually(lambda: getattr(listener, "refused", {}).get("busy") == 7)
            conn = await dial(listener.addresses[0], honest, expect=server.agent_id, config=limited())
            await roundtrip(conn, honest)
            await conn.close()
            assert node.peers == [honest.agent_id]
        finally:
            for s in flood:
                s.close()
            await listener.close()

    run(main())


def test_a_unix_peer_over_its_limit_is_refused_busy(sockdir: Path) -> None:
    server, client = Identity.generate(), Identity.generate()

    async def main() -> None:
        url = f"unix://{sockdir}/run/n.sock"
        listener = await listen(url, server, EchoNode(server), config=limited())
        try:
            for _ in range(3):
                conn = await dial(url, client, expect=server.agent_id, config=limited())
                await roundtrip(conn, client)
                await conn.close()
            with pytest.raises(HandshakeError, match="busy"):
                await dial(url, client, expect=server.agent_id, config=limited())
            assert getattr(listener, "refused", {}) == {"busy": 1}
        finally:
            await listener.close()

    run(main())


# --- QUIC ---------------------------------------------------------------------------------------


def client_initial(port: int) -> bytes:
    """The first datagram of a new QUIC connection (a client Initial, padded to 1200 bytes)."""
    qc = QuicConfiguration(is_client=True, alpn_protocols=[ALPN])
    qc.verify_mode = ssl.CERT_NONE
    quic = QuicConnection(configuration=qc)
    now = time.monotonic()
    quic.connect(("127.0.0.1", port), now=now)
    return quic.datagrams_to_send(now=now)[0][0]


async def send_initials(port: int, count: int, *, answers: float = 0.5) -> list[bytes]:
    """``count`` new-connection Initials from FLOOD_SOURCE; the datagrams that came back."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((FLOOD_SOURCE, 0))
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    got: list[bytes] = []
    try:
        for _ in range(count):
            await loop.sock_sendto(sock, client_initial(port), ("127.0.0.1", port))
        end = loop.time() + answers
        while (left := end - loop.time()) > 0:
            try:
                got.append(await asyncio.wait_for(loop.sock_recv(sock, 65536), left))
            except TimeoutError:
                break
    finally:
        sock.close()
    return got


def is_retry(datagram: bytes) -> bool:
    """A QUIC v1 Retry packet: long header (0x80), version 1, packet type 3."""
    return (
        bool(datagram[0] & 0x80) and datagram[1:5] == b"\x00\x00\x00\x01" and (datagram[0] & 0x30) >> 4 == 3
    )


def test_a_quic_flood_from_one_source_is_limited_while_another_source_connects() -> None:
    server, honest = Identity.generate(), Identity.generate()

    async def main() -> None:
        node = EchoNode(server)
        listener = await listen("quic://127.0.0.1:0", server, node, config=limited(quic_retry="never"))
        assert isinstance(listener, QuicListener)
        port = int(listener.addresses[0].rsplit(":", 1)[1])
        try:
            await send_initials(port, 10, answers=0.2)
            assert listener.refused.get("busy") == 7  # 3 got a handshake, the rest were dropped
            conn = await dial(listener.addresses[0], honest, expect=server.agent_id, config=limited())
            await roundtrip(conn, honest)
            await conn.close()
            assert node.peers == [honest.agent_id]
        finally:
            await listener.close()

    run(main())


def test_quic_retry_is_on_the_wire_when_forced_and_a_client_still_connects() -> None:
    server, client = Identity.generate(), Identity.generate()

    async def main() -> None:
        listener = await listen(
            "quic://127.0.0.1:0", server, EchoNode(server), config=limited(quic_retry="always")
        )
        assert isinstance(listener, QuicListener)
        port = int(listener.addresses[0].rsplit(":", 1)[1])
        try:
            answers = await send_initials(port, 5)
            assert len(answers) == 5 and all(is_retry(d) for d in answers)
            assert listener.retries == 5 and listener.refused == {}  # Retry costs the source no token
            conn = await dial(listener.addresses[0], client, expect=server.agent_id, config=limited())
            await roundtrip(conn, client)  # the client answered the Retry with its token
            await conn.close()
            assert listener.retries == 6 and listener.accepted == 1
        finally:
            await listener.close()

    run(main())


def test_quic_retry_turns_on_while_new_connections_flood() -> None:
    server = Identity.generate()

    async def main() -> None:
        config = limited(quic_retry="auto", retry_threshold=5.0, handshake_burst=100)
        listener = await listen("quic://127.0.0.1:0", server, EchoNode(server), config=config)
        assert isinstance(listener, QuicListener)
        port = int(listener.addresses[0].rsplit(":", 1)[1])
        try:
            answers = await send_initials(port, 12)
            assert listener.retry.activations == 1
            # the first 5 went through (6 when the flood straddles a second), then Retry
            assert 6 <= listener.retries <= 7
            assert sum(is_retry(d) for d in answers) == listener.retries
        finally:
            await listener.close()

    run(main())
