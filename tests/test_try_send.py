"""``Connection.try_send``: the send path's call for a frame that needs no wait, on every
transport over real sockets. It queues and writes as ``send`` does, says False only when ``send``
would have to wait (a full send queue), and raises as ``send`` does once the connection closed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from conftest import TRANSPORT_PARAMS, EchoNode, listen_url, message_of, ping_frame, run

from iac.errors import TransportError
from iac.transport import dial, listen
from iac.transport.base import Connection, TransportConfig
from iac.wire.enums import MessageType
from iac.wire.identity import Identity
from iac.wire.message import Session

transports = pytest.mark.parametrize("transport", TRANSPORT_PARAMS)
FAST = TransportConfig(handshake_timeout=5.0, linger_timeout=0.5)


@transports
def test_frames_taken_by_try_send_arrive_in_order_with_those_of_send(transport: str, sockdir: Path) -> None:
    server, client = Identity.generate(), Identity.generate()

    async def main() -> None:
        listener = await listen(listen_url(transport, sockdir), server, EchoNode(server), config=FAST)
        async with listener:
            conn = await dial(listener.addresses[0], client, expect=server.agent_id, config=FAST)
            session = Session()
            for i in range(6):
                frame = ping_frame(client, server.agent_id, session, f'"{i}"')
                if i % 2:
                    await conn.send(frame)
                else:
                    assert conn.try_send(frame), "an empty send queue takes a frame without a wait"
            replies = [message_of(await conn.recv()) for _ in range(6)]
            assert [r.msg_type for r in replies] == [MessageType.REPLY] * 6
            assert [r.payload_json for r in replies] == [f'"{i}"' for i in range(6)]
            assert [r.reply_to for r in replies] == sorted(r.reply_to for r in replies)
            await conn.close()

    run(main())


@transports
def test_try_send_says_false_when_send_would_wait_and_raises_once_closed(
    transport: str, sockdir: Path
) -> None:
    """A peer that does not read: try_send takes frames until the bounded send queue is full,
    then says False (and keeps saying it) instead of queueing past the bound (send() waits then:
    test_conformance's test_send_waits_when_queue_is_full). Once the connection closed,
    try_send raises the transport error send() raises."""
    server, client = Identity.generate(), Identity.generate()
    release = asyncio.Event()

    async def lazy(conn: Connection) -> None:
        await release.wait()
        await conn.close()

    async def main() -> None:
        listener = await listen(listen_url(transport, sockdir), server, lazy, config=FAST)
        async with listener:
            small = TransportConfig(
                handshake_timeout=5.0, linger_timeout=0.5, send_queue_frames=8, send_queue_bytes=64 * 1024
            )
            conn = await dial(listener.addresses[0], client, expect=server.agent_id, config=small)
            frame = ping_frame(client, server.agent_id, Session(), '"' + "y" * 4000 + '"')
            taken = 0
            while conn.try_send(frame):  # no await: the socket's buffer and then the queue fill up
                taken += 1
                assert taken < 10_000, "try_send queued past the send queue's bound"
            assert taken >= 1
            assert not conn.try_send(frame), "a full queue stays full while nothing is written"
            release.set()
            await conn.wait_closed()
            with pytest.raises(TransportError):
                conn.try_send(frame)

    run(main())
