"""Refusing a HELLO: one GOAWAY (with the refusal's close code), not two; the nonce cache is
one per config, filled only by admitted peers; every refusal is counted and logged."""

from __future__ import annotations

import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import EchoNode, roundtrip, run

import iac.transport.quic.connection as quic_connection
import iac.transport.session as session
from iac.errors import HandshakeError
from iac.protocol.handshake import HelloDraft, NonceCache
from iac.testing import eventually
from iac.transport import dial, listen
from iac.transport.base import Connection, TransportConfig
from iac.transport.quic import QuicListener
from iac.wire.identity import Identity
from iac.wire.message import sign_hello


@pytest.mark.parametrize("refuser", ["server", "client"])
@pytest.mark.parametrize("transport", ["quic", "tls"])
def test_a_refused_hello_gets_one_goaway(
    transport: str, refuser: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, client = Identity.generate(), Identity.generate()
    goaways: Counter[str] = Counter()
    goaway_frame = session.goaway_frame
    abort = quic_connection.QuicConn._abort

    def counted_goaway(code: int, reason: str = "") -> bytes:  # a refusal in the HELLO exchange
        goaways["handshake"] += 1
        return goaway_frame(code, reason)

    def counted_abort(conn: Any, code: int, reason: str, *, goaway: bool) -> None:  # a QUIC close
        if goaway and conn.dialed == (refuser == "client"):
            goaways["close"] += 1
        abort(conn, code, reason, goaway=goaway)

    monkeypatch.setattr(session, "goaway_frame", counted_goaway)
    monkeypatch.setattr(quic_connection.QuicConn, "_abort", counted_abort)

    def bad_signature(d: HelloDraft) -> bytes:
        raw = sign_hello(server, d.hello, d.domain)
        return raw[:-1] + bytes([raw[-1] ^ 0x01])  # the signature is the last field

    if refuser == "server":
        config, refusal = TransportConfig(admission=lambda agent_id: False), "admission_denied"
    else:
        config, refusal = TransportConfig(hello_hook=bad_signature), "hello_bad_signature"

    async def serve(conn: Connection) -> None:
        await conn.close()

    async def main() -> None:
        listener = await listen(f"{transport}://127.0.0.1:0", server, serve, config=config)
        try:
            with pytest.raises(HandshakeError) as err:
                await dial(listener.addresses[0], client, config=TransportConfig(linger_timeout=0.2))
            assert err.value.reason == refusal
        finally:
            await listener.close()

    run(main())
    assert goaways == {"handshake": 1}


TRANSPORTS = ["quic", "tls", "unix"]


def _url(transport: str, sockdir: Path) -> str:
    return f"unix://{sockdir}/run/n.sock" if transport == "unix" else f"{transport}://127.0.0.1:0"


async def _dial_and_use(url: str, me: Identity, expect: str, config: TransportConfig) -> None:
    """Dial and make one round trip (UNIX: the server's verdict on our HELLO comes after dial)."""
    conn = await dial(url, me, expect=expect, config=config)
    try:
        await roundtrip(conn, me)
    finally:
        await conn.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_keys_the_admission_refuses_cannot_deny_an_admitted_peer(transport: str, sockdir: Path) -> None:
    """A flood of HELLOs from keys the policy refuses fills no nonce cache: the admitted peer
    still gets in (the nonce was recorded before admission, and a full cache refused everyone)."""
    server, friend = Identity.generate(), Identity.generate()
    cache = NonceCache(max_entries=4)
    cache.check_and_add(b"\x00" * 16, time.time_ns() // 1000)  # one nonce seen already
    config = TransportConfig(
        nonce_cache=cache, admission=lambda agent_id: agent_id == friend.agent_id, linger_timeout=0.2
    )
    client_config = TransportConfig(linger_timeout=0.2)

    async def main() -> None:
        listener = await listen(_url(transport, sockdir), server, EchoNode(server), config=config)
        try:
            for _ in range(6):
                with pytest.raises(HandshakeError) as exc_info:
                    await _dial_and_use(
                        listener.addresses[0], Identity.generate(), server.agent_id, client_config
                    )
                assert exc_info.value.reason == "admission_denied"
            assert len(cache) == 1
            await _dial_and_use(listener.addresses[0], friend, server.agent_id, client_config)
            assert len(cache) == 2
        finally:
            await listener.close()

    run(main())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_configured_nonce_cache_is_used_even_while_empty(transport: str, sockdir: Path) -> None:
    server, client = Identity.generate(), Identity.generate()
    cache = NonceCache()  # empty: len() == 0, which once read as "no cache configured"
    config = TransportConfig(nonce_cache=cache, linger_timeout=0.2)

    async def main() -> None:
        listener = await listen(_url(transport, sockdir), server, EchoNode(server), config=config)
        try:
            await _dial_and_use(listener.addresses[0], client, server.agent_id, config)
            assert len(cache) == 1
        finally:
            await listener.close()

    run(main())


def test_a_hello_accepted_on_tls_is_a_replay_on_quic() -> None:
    """One nonce cache per node: the listeners of one config share it, so the same client HELLO
    bytes (same node certificate, so the same binding) are refused on the second transport."""
    server, client = Identity.generate(), Identity.generate()
    config = TransportConfig(linger_timeout=0.2)  # no cache given: one is made for this config
    sent: list[bytes] = []

    def capture(d: HelloDraft) -> bytes:
        raw = sign_hello(client, d.hello, d.domain)
        sent.append(raw)
        return raw

    def replay(d: HelloDraft) -> bytes:
        return sent[0]

    async def main() -> None:
        tls_node, quic_node = EchoNode(server), EchoNode(server)
        tls = await listen("tls://127.0.0.1:0", server, tls_node, config=config)
        quic = await listen("quic://127.0.0.1:0", server, quic_node, config=config)
        try:
            await _dial_and_use(
                tls.addresses[0], client, server.agent_id, TransportConfig(hello_hook=capture)
            )
            with pytest.raises(HandshakeError) as exc_info:
                await dial(
                    quic.addresses[0], client, config=TransportConfig(hello_hook=replay, linger_timeout=0.2)
                )
            assert exc_info.value.reason == "replayed_hello"
            assert tls_node.peers == [client.agent_id]
            assert quic_node.peers == []  # the QUIC listener refused the HELLO
            assert isinstance(quic, QuicListener) and quic.refused == {"replayed_hello": 1}
        finally:
            await tls.close()
            await quic.close()

    run(main())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_refusals_are_counted_by_reason_and_logged(
    transport: str, sockdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The refusing side counts each refusal in ``listener.refused`` by reason and logs it at INFO
    with the peer's address (QUIC did neither for refusals after its handshake)."""
    server, client = Identity.generate(), Identity.generate()
    config = TransportConfig(admission=lambda agent_id: False, linger_timeout=0.2)

    async def main() -> None:
        listener = await listen(_url(transport, sockdir), server, EchoNode(server), config=config)
        try:
            with pytest.raises(HandshakeError) as exc_info:
                await _dial_and_use(listener.addresses[0], client, server.agent_id, config)
            assert exc_info.value.reason == "admission_denied"
            await eventually(lambda: getattr(listener, "refused", None) == {"admission_denied": 1})
        finally:
            await listener.close()

    with caplog.at_level(logging.INFO, logger="iac.transport"):
        run(main())
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any(
        f"refused {transport} connection from {transport}://" in line and "admission_denied" in line
        for line in lines
    ), lines
