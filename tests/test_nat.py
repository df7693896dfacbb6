"""Through NATs: one UDP socket per node (dials leave from the QUIC listener's socket)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import pytest
from conftest import message_of, run

from iac.errors import ConfigError
from iac.node.config import NodeConfig
from iac.node.node import Node
from iac.testing import eventually
from iac.transport.base import Connection
from iac.transport.quic import QuicListener, dial_quic, listen_quic
from iac.transport.quic.backend import get_backend
from iac.wire._pb.iac_pb2 import MessageType
from iac.wire.identity import Identity
from iac.wire.message import Session, build_message, encode_message_frame

LOOPBACK = "quic://127.0.0.1:0"


def frame(identity: Identity, to: str, payload: str) -> bytes:
    msg = build_message(
        sender=identity.agent_id,
        to=to,
        msg_type=MessageType.COMMAND,
        session=Session(),
        timestamp_us=time.time_ns() // 1000,
        payload_json=payload,
    )
    return encode_message_frame(identity, msg)


class Collect:
    """A listener's verified connections."""

    def __init__(self) -> None:
        self.conns: list[Connection] = []

    async def __call__(self, conn: Connection) -> None:
        self.conns.append(conn)


def test_dial_from_listener_socket_is_observed_at_listen_address() -> None:
    async def main() -> None:
        a_id, b_id, c_id = Identity.generate(), Identity.generate(), Identity.generate()
        at_a, at_b, at_c = Collect(), Collect(), Collect()
        a = await listen_quic(LOOPBACK, a_id, at_a)
        b = await listen_quic(LOOPBACK, b_id, at_b)
        c = await listen_quic(LOOPBACK, c_id, at_c)
        try:
            conn = await a.dial(b.addresses[0], expect=b_id.agent_id)
            assert conn.shared_socket
            await eventually(lambda: len(at_b.conns) == 1)
            # B sees A at the address A listens on: the one socket.
            assert at_b.conns[0].peer.address == a.addresses[0]
            # Frames flow both ways over the dialed connection.
            await conn.send(frame(a_id, b_id.agent_id, '"to b"'))
            got = await asyncio.wait_for(at_b.conns[0].recv(), 5)
            assert message_of(got).payload_json == '"to b"'
            await at_b.conns[0].send(frame(b_id, a_id.agent_id, '"to a"'))
            back = await asyncio.wait_for(conn.recv(), 5)
            assert message_of(back).payload_json == '"to a"'
            # A second dial from the same socket, to another peer, is seen at the same address.
            conn2 = await a.dial(c.addresses[0], expect=c_id.agent_id)
            await eventually(lambda: len(at_c.conns) == 1)
            assert at_c.conns[0].peer.address == a.addresses[0]
            # Closing a dialed connection leaves the listener serving.
            await conn.close()
            await conn2.close()
            back_in = await dial_quic(a.addresses[0], c_id, expect=a_id.agent_id)
            await eventually(lambda: len(at_a.conns) == 1)
            await back_in.close()
            assert a.family is not None
            server = a._server
            # Nothing of the closed dials stays in the server's connection table.
            dialed = [p for p in server._protocols.values() if getattr(p.conn, "dialed", False)]
            assert not dialed
        finally:
            for lst in (a, b, c):
                await lst.close()

    run(main())


def test_own_socket_dial_is_seen_elsewhere() -> None:
    """Without the listener, a dial's own socket is what the peer sees (the contrast)."""

    async def main() -> None:
        a_id, b_id = Identity.generate(), Identity.generate()
        at_b = Collect()
        a = await listen_quic(LOOPBACK, a_id, Collect())
        b = await listen_quic(LOOPBACK, b_id, at_b)
        try:
            conn = await dial_quic(b.addresses[0], a_id, expect=b_id.agent_id)
            assert not conn.shared_socket
            await eventually(lambda: len(at_b.conns) == 1)
            assert at_b.conns[0].peer.address != a.addresses[0]
            await conn.close()
        finally:
            await a.close()
            await b.close()

    run(main())


def _peer_address(node: Node, peer: str) -> str:
    conn = node._peers.table.get(peer)
    assert conn is not None
    return conn.peer.address


@pytest.mark.parametrize("one_socket", [True, False])
def test_node_dials_from_its_listener(one_socket: bool) -> None:
    async def main() -> None:
        config = NodeConfig(one_socket=one_socket)
        async with (
            Node(listen=[LOOPBACK], config=config) as a,
            Node(listen=[LOOPBACK], config=config) as b,
        ):
            b.on(MessageType.RUN)(lambda ctx: ctx.payload)
            a.add_peer(b.agent_id, *b.addresses)
            assert (await a.request(b.agent_id, MessageType.RUN, "hi", timeout=10)).payload == "hi"
            seen = _peer_address(b, a.agent_id)
            assert (seen == a.addresses[0]) is one_socket

    run(main())


def test_one_socket_refused_clearly_without_the_pinned_library() -> None:
    async def main() -> None:
        lib = dataclasses.replace(
            get_backend("aioquic"), name="aioquic-other", version="9.9.0", attach_dialed=None
        )
        lst = QuicListener(Identity.generate(), NodeConfig().transport, Collect(), _tickets(), lib)
        with pytest.raises(ConfigError, match=r"aioquic 1\.7.*aioquic-other 9\.9\.0.*one_socket=False"):
            lst.check_dial()
        assert not lst.can_dial

    run(main())


def _tickets() -> Any:
    from iac.transport.quic import ServerTicketStore

    return ServerTicketStore()
