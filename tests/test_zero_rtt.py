"""QUIC resumption and 0-RTT: HELLO and first messages as early data; a captured early
flight replayed to the server, or to another server of its cluster, delivers nothing twice;
in CA mode a resumption needs a client certificate of the CA, proven when the ticket was
issued and still valid."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import HERE, ROOT, message_of, run
from cryptography import x509

from iac.errors import HandshakeError, IacError
from iac.testing import UdpRelay, eventually
from iac.transport.base import Connection, TransportConfig
from iac.transport.certs import CertAuthority, init_ca
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
        self.config = TransportConfig()
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
            "quic://127.0.0.1:0", self.identity, self.on_connection, config=self.config, tickets=self.tickets
        )
        return self.listener.addresses[0]


def test_resumed_session_sends_hello_and_message_as_early_data(tmp_path: Path) -> None:
    async def main() -> None:
        node = Node(ServerTicketStore())
        url = await node.start()
        client = Identity.generate()
        store = ClientTicketStore(tmp_path / "tickets.json")
        first = await dial_quic(url, client, expect=node.identity.agent_id, tickets=store)
        assert not first.peer.resumed and first.early_data_accepted is None
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
        assert accepted.early_data_accepted is True
        await eventually(lambda: conn.peer_hello_verified)
        assert conn.peer.hello.agent_id == node.identity.agent_id
        assert conn.peer.resumed and conn.early_data_accepted is True
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
        assert accepted.early_data_accepted is False
        assert not conn.peer.resumed  # and the client says so once the server's HELLO verified
        assert conn.early_data_accepted is False
        assert node.tickets.refused == 1
        await conn.close()
        assert node.listener is not None
        await node.listener.close()

    run(main())


def _with(stored: Any, url: str) -> ClientTicketStore:
    store = ClientTicketStore()
    store.put(url, stored.ticket, stored.cert_sha256, stored.agent_id)
    return store


# --- CA mode: a resumed session is a client that proved a certificate of the CA ----------------


def _ca(tmp_path: Path) -> Path:
    d = tmp_path / "certs"
    init_ca(d, ["server", "client"])
    return d


def _ca_config(d: Path, cert: str | None, *, ca: bool = True) -> TransportConfig:
    files = {} if cert is None else {"cert_file": str(d / f"{cert}.pem"), "key_file": str(d / f"{cert}.key")}
    return TransportConfig(ca_file=str(d / "ca.pem") if ca else None, linger_timeout=0.2, **files)  # type: ignore[arg-type]


def test_ca_mode_resumes_a_verified_client_with_early_data(tmp_path: Path) -> None:
    d = _ca(tmp_path)

    async def main() -> None:
        node = Node(ServerTicketStore())
        node.config = _ca_config(d, "server")
        url = await node.start()
        client, store = Identity.generate(), ClientTicketStore()
        config = _ca_config(d, "client")
        first = await dial_quic(url, client, expect=node.identity.agent_id, config=config, tickets=store)
        await eventually(lambda: url in store)
        await first.close()
        conn = await dial_quic(url, client, expect=node.identity.agent_id, config=config, tickets=store)
        assert conn.early_data
        await conn.send(message(client, node.identity.agent_id, Session(), "early"))
        await eventually(lambda: node.delivered == ["early"])
        await eventually(lambda: conn.peer_hello_verified)
        assert conn.peer.resumed and conn.early_data_accepted is True
        await conn.close()
        assert node.listener is not None
        await node.listener.close()

    run(main())


def test_ca_mode_refuses_a_resumption_whose_ticket_proves_no_client_certificate(tmp_path: Path) -> None:
    """A ticket issued without a client certificate (by a listener of the same identity and
    ticket store that is not in CA mode) does not resume a session in CA mode: the server asks
    for a certificate, the client has none, and its early message is never delivered. (aioquic
    skips the certificate request on resumption: the session used to be served.)"""
    d = _ca(tmp_path)

    async def main() -> None:
        tickets = ServerTicketStore()
        node = Node(tickets)
        node.config = _ca_config(d, "server", ca=False)  # same certificate, no CA mode
        open_url = await node.start()
        ca_node = Node(tickets)
        ca_node.identity = node.identity
        ca_node.config = _ca_config(d, "server")
        ca_url = await ca_node.start()
        client, store = Identity.generate(), ClientTicketStore()
        first = await dial_quic(open_url, client, expect=node.identity.agent_id, tickets=store)
        await eventually(lambda: open_url in store)
        await first.close()
        stored = store.pop(open_url)
        assert stored is not None
        conn = await dial_quic(ca_url, client, expect=node.identity.agent_id, tickets=_with(stored, ca_url))
        assert conn.early_data
        with contextlib.suppress(IacError):
            await conn.send(message(client, node.identity.agent_id, Session(), "early"))
        with pytest.raises(HandshakeError, match="client certificate required") as exc_info:
            await conn.recv()
        assert exc_info.value.reason == "admission_denied"
        assert ca_node.delivered == [] and ca_node.conns == []
        assert ca_node.listener is not None and ca_node.listener.refused == {"admission_denied": 1}
        for n in (node, ca_node):
            assert n.listener is not None
            await n.listener.close()

    run(main())


def test_ca_mode_refuses_a_resumption_once_the_client_certificate_expired(tmp_path: Path) -> None:
    """The ticket carries the chain its session verified; when that chain no longer verifies
    (here: the certificate expired), the ticket resumes nothing and the full handshake refuses
    the expired certificate."""
    d = _ca(tmp_path)
    soon = dt.datetime.now(dt.UTC) - dt.timedelta(days=1) + dt.timedelta(seconds=3)
    short = CertAuthority.load(d).issue("short", valid_from=soon, days=1)  # expires in 3 s
    (d / "short.pem").write_bytes(short.cert_pem)
    (d / "short.key").write_bytes(short.key_pem)

    async def main() -> None:
        node = Node(ServerTicketStore())
        node.config = _ca_config(d, "server")
        url = await node.start()
        client, store = Identity.generate(), ClientTicketStore()
        config = _ca_config(d, "short")
        first = await dial_quic(url, client, expect=node.identity.agent_id, config=config, tickets=store)
        await eventually(lambda: url in store)
        await first.close()
        # valid through the whole second of notAfter
        await asyncio.sleep(max(0.0, (expiry - dt.datetime.now(dt.UTC)).total_seconds()) + 1.2)
        conn = await dial_quic(url, client, expect=node.identity.agent_id, config=config, tickets=store)
        assert conn.early_data
        with contextlib.suppress(IacError):
            await conn.send(message(client, node.identity.agent_id, Session(), "late"))
        with pytest.raises(HandshakeError, match="client certificate refused") as exc_info:
            await conn.recv()
        assert exc_info.value.reason == "admission_denied"
        assert node.delivered == []
        assert node.listener is not None
        await node.listener.close()

    expiry = x509.load_pem_x509_certificate(short.cert_pem).not_valid_after_utc
    run(main())


# --- a cluster: servers with one identity that share tickets, nonce cache and replay store ------


class ClusterServer:
    """tests/zero_rtt_server.py in a process of its own."""

    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "zero_rtt_server.py"), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        self.got: list[str] = []
        self.url = str(self._read()["url"])

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, "the server process ended"
        item: dict[str, Any] = json.loads(line)
        if "got" in item:
            self.got.append(item["got"])
            return self._read()
        return item

    def stats(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("stats\n")
        self.proc.stdin.flush()
        return self._read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            with contextlib.suppress(OSError):
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.mark.parametrize("tickets", ["single_use", "reused"])
def test_an_early_flight_replayed_to_a_second_server_of_the_cluster_delivers_nothing_twice(
    tickets: str, tmp_path: Path, redis_url: str
) -> None:
    """Two server processes with one identity and certificate share, in Redis, the session
    tickets, the HELLO nonce cache and the replay store. A client resumes at the first one and
    sends a message as 0-RTT data; the captured flight replayed to the second delivers nothing:
    the ticket was taken (single-use across the cluster), and when tickets are reused, the
    shared nonce cache refuses the replayed HELLO."""
    d = _ca(tmp_path)
    key = tmp_path / "server.key"
    server_identity = Identity.generate()
    server_identity.save(key)
    args = [str(key), str(d / "server.pem"), str(d / "server.key"), redis_url, f"t:{uuid.uuid4().hex}"]
    if tickets == "reused":
        args.append("reuse")
    a = ClusterServer(args)
    b = ClusterServer(args)

    async def main() -> None:
        port = int(a.url.rsplit(":", 1)[1])
        relay = UdpRelay(("127.0.0.1", port), seed=3)
        host, rport = await relay.start()
        via = f"quic://{host}:{rport}"
        client, store = Identity.generate(), ClientTicketStore()
        first = await dial_quic(via, client, expect=server_identity.agent_id, tickets=store)
        await eventually(lambda: via in store)
        await first.close()
        relay.start_capture(limit=8)
        conn = await dial_quic(via, client, expect=server_identity.agent_id, tickets=store)
        assert conn.early_data
        await conn.send(message(client, server_identity.agent_id, Session(), "once"))
        await eventually(lambda: conn.peer_hello_verified)
        assert conn.early_data_accepted is True
        captured = relay.stop_capture()
        await conn.close()
        await relay.close()
        bport = int(b.url.rsplit(":", 1)[1])
        await UdpRelay(("127.0.0.1", bport)).replay(captured)

    try:
        run(main())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            stats = b.stats()
            if stats["tickets"]["refused"] or stats["refused"]:
                break
            time.sleep(0.05)
        a.stats()  # read what A reported
        if tickets == "single_use":
            assert stats["tickets"] == {"resumed": 0, "refused": 1}  # the ticket was taken at A
        else:
            assert stats["tickets"]["resumed"] == 1  # the replay resumed the TLS session at B ...
            assert stats["refused"] == {"replayed_hello": 1}  # ... and its HELLO was refused
        assert a.got == ["once"] and b.got == []
    finally:
        a.stop()
        b.stop()


def test_a_stored_ticket_comes_back_as_the_library_that_made_it(tmp_path: Path) -> None:
    """A ticket file (and a server's shared ticket store) keep which QUIC library made each ticket,
    and a ticket without a server name stays without one: a listener gets back the class its TLS
    made, whatever backend is selected; an entry naming a library not installed here is dropped
    (a full handshake), not an error."""
    from aioquic.tls import CipherSuite, SessionTicket

    now = dt.datetime.now(dt.UTC)
    ticket = SessionTicket(
        age_add=7, cipher_suite=CipherSuite.AES_128_GCM_SHA256, not_valid_after=now + dt.timedelta(hours=1),
        not_valid_before=now, resumption_secret=b"s" * 32, server_name=None, ticket=b"t" * 16,
        max_early_data_size=0xFFFFFFFF, other_extensions=[],
    )  # fmt: skip
    path = tmp_path / "tickets.json"
    store = ClientTicketStore(path)
    store.put("quic://a", ticket, b"c" * 32, "agent")
    assert json.loads(path.read_text())["quic://a"]["ticket"]["lib"] == "aioquic"
    back = ClientTicketStore(path).pop("quic://a")
    assert back is not None and type(back.ticket) is SessionTicket and back.ticket.server_name is None
    assert back.ticket == ticket
    store.put("quic://b", ticket, b"c" * 32, "agent")
    data = json.loads(path.read_text())
    data["quic://b"]["ticket"]["lib"] = "nosuchquic"
    path.write_text(json.dumps(data))
    assert ClientTicketStore(path).pop("quic://b") is None
