"""QUIC resumption and 0-RTT: HELLO and first messages as early data, and a
captured early flight replayed to the server delivers nothing twice."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from conftest import message_of, run

from iac.testing import UdpRelay, eventually
from iac.transport.base import Connection
from iac.transport.quic import (
    ClientTicketStore,
    QuicConn,
    QuicListener,
    ServerTicketStore,
    dial_quic,
    listen_quic,
)
from iac.wire._pb.iac_pb2 import MessageType
from iac.wire.identity import Identity
from iac.wire.message import Session, build_message, encode_message_frame


def message(identity: Identity, to: str, session: Session, payload: str) -> bytes:
    msg = build_message(
        sender=identity.agent_id,
        to=to,
        msg_type=MessageType.COMMAND,
        session=session,
        timestamp_us=time.time_ns() // 1000,
        payload_json=payload,
    )
    return encode_message_frame(identity, msg)


class Node:
    def __init__(self, tickets: ServerTicketStore) -> None:
        self.identity = Identity.generate()
        self.tickets = tickets
        self.delivered: list[str] = []
        self.conns: list[Connection] = []
        self.listener: QuicListener | None = None

    async def on_connection(self, conn: Connection) -> None:
        self.conns.append(conn)
        try:
            while True:
                item = await conn.recv()
                assert message_of(item) is not None
                self.delivered.append(message_of(item).payload_json)
        except Exception:
            return

    async def start(self) -> str:
        self.listener = await listen_quic(
            "quic://127.0.0.1:0", self.identity, self.on_connection, tickets=self.tickets
        )
        return self.listener.addresses[0]


def test_resumed_session_sends_hello_and_message_as_early_data(tmp_path: Path) -> None:
    async def main() -> None:
        node = Node(ServerTicketStore())
        url = await node.start()
        client = Identity.generate()
        store = ClientTicketStore(tmp_path / "tickets.json")
        first = await dial_quic(url, client, expect=node.identity.agent_id, tickets=store)
        assert not first.peer.resumed
        await eventually(lambda: url in store)
        await first.close()
        assert (tmp_path / "tickets.json").stat().st_mode & 0o077 == 0

        # A new store object reads the ticket back from the file.
        store2 = ClientTicketStore(tmp_path / "tickets.json")
        conn = await dial_quic(url, client, expect=node.identity.agent_id, tickets=store2)
        assert conn.peer.resumed and conn.early_data
        assert url not in store2  # a ticket is used once
        await conn.send(message(client, node.identity.agent_id, Session(), "early"))
        await eventually(lambda: node.delivered == ["early"])
        accepted = node.conns[-1]
        assert isinstance(accepted, QuicConn)
        assert accepted.peer.resumed
        assert accepted._quic.tls.early_data_accepted
        await eventually(lambda: conn.peer_hello_verified)
        assert conn.peer.hello.agent_id == node.identity.agent_id
        assert node.tickets.resumed == 1
        await eventually(lambda: url in store2)  # a fresh ticket for next time
        await conn.close()
        assert node.listener is not None
        await node.listener.close()

    run(main())


async def replay_scenario(server_tickets: ServerTicketStore) -> tuple[Node, UdpRelay]:
    """Resume through a relay that captures the client's first datagrams, deliver one
    early message, close, then replay the captured flight to the server."""
    node = Node(server_tickets)
    url = await node.start()
    port = int(url.rsplit(":", 1)[1])
    relay = UdpRelay(("127.0.0.1", port), seed=3)
    host, rport = await relay.start()
    via = f"quic://{host}:{rport}"
    client = Identity.generate()
    store = ClientTicketStore()
    first = await dial_quic(via, client, expect=node.identity.agent_id, tickets=store)
    await eventually(lambda: via in store)
    await first.close()

    relay.start_capture(limit=8)
    conn = await dial_quic(via, client, expect=node.identity.agent_id, tickets=store)
    assert conn.early_data
    await conn.send(message(client, node.identity.agent_id, Session(), "once"))
    await eventually(lambda: node.delivered == ["once"])
    captured = relay.stop_capture()
    assert captured
    await conn.close()
    accepted = node.conns[-1]
    await accepted.wait_closed()  # the server forgot the connection's ids

    await relay.replay(captured)
    return node, relay


def test_replayed_early_flight_with_single_use_tickets() -> None:
    async def main() -> None:
        tickets = ServerTicketStore()
        node, relay = await replay_scenario(tickets)
        # The replayed ClientHello names a ticket that was taken out when it was used.
        await eventually(lambda: tickets.refused >= 1)
        assert node.delivered == ["once"]
        assert node.listener is not None
        assert node.listener.accepted == 2
        await node.listener.close()
        await relay.close()

    run(main())


def test_replayed_early_flight_against_ticket_reuse_is_stopped_by_hello_nonce() -> None:
    """The server reuses tickets (aioquic's default), so the replay resumes and its
    early data decrypts: IAC's HELLO nonce cache refuses the replayed HELLO, and the
    early frames that came with it are dropped with the connection."""

    async def main() -> None:
        tickets = ServerTicketStore(reuse=True)
        node, relay = await replay_scenario(tickets)
        assert node.listener is not None
        listener = node.listener
        await eventually(lambda: listener.refused.get("replayed_hello", 0) == 1)
        assert tickets.resumed == 2  # the replay did resume the TLS session
        assert node.delivered == ["once"]
        assert listener.accepted == 2
        await listener.close()
        await relay.close()

    run(main())


def test_rejected_early_data_is_sent_again_after_the_handshake() -> None:
    """A ticket the server no longer knows (already used): the session is not resumed,
    0-RTT is rejected, and aioquic sends the HELLO and message again in 1-RTT packets;
    the HELLO's binding (the stored certificate hash) still matches this server."""

    async def main() -> None:
        node = Node(ServerTicketStore())
        url = await node.start()
        client = Identity.generate()
        store = ClientTicketStore()
        first = await dial_quic(url, client, tickets=store)
        await eventually(lambda: url in store)
        await first.close()
        stored = store.pop(url)
        assert stored is not None
        second = await dial_quic(url, client, tickets=_with(stored, url))  # uses the ticket
        await eventually(lambda: second.peer_hello_verified)
        await second.close()
        conn = await dial_quic(url, client, tickets=_with(stored, url))  # the same ticket again
        assert conn.early_data
        await conn.send(message(client, node.identity.agent_id, Session(), "late"))
        await eventually(lambda: "late" in node.delivered)
        await eventually(lambda: conn.peer_hello_verified)
        accepted = node.conns[-1]
        assert accepted.peer.hello.agent_id == client.agent_id
        assert not accepted.peer.resumed  # the server did not resume the TLS session
        assert node.tickets.refused == 1
        await conn.close()
        assert node.listener is not None
        await node.listener.close()

    run(main())


def _with(stored: Any, url: str) -> ClientTicketStore:
    store = ClientTicketStore()
    store.put(url, stored.ticket, stored.cert_sha256, stored.agent_id)
    return store
