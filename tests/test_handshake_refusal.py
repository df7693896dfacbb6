"""A side that refuses a HELLO sends one GOAWAY (with the refusal's close code), not two."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from conftest import run

import iac.transport.quic.connection as quic_connection
import iac.transport.session as session
from iac.errors import AdmissionDenied, HelloSignatureInvalid
from iac.protocol.handshake import HelloDraft
from iac.transport import dial, listen
from iac.transport.base import Connection, TransportConfig
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
        config, refusal = TransportConfig(admission=lambda agent_id: False), AdmissionDenied
    else:
        config, refusal = TransportConfig(hello_hook=bad_signature), HelloSignatureInvalid

    async def serve(conn: Connection) -> None:
        await conn.close()

    async def main() -> None:
        listener = await listen(f"{transport}://127.0.0.1:0", server, serve, config=config)
        try:
            with pytest.raises(refusal):
                await dial(listener.addresses[0], client, config=TransportConfig(linger_timeout=0.2))
        finally:
            await listener.close()

    run(main())
    assert goaways == {"handshake": 1}
