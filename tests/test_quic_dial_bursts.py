"""Dial bursts: the dialing loop's bound on QUIC handshakes in flight (:mod:`.dialslots`), the
QUIC listener's memory of dials it gave up on (their later Initials open no connection), and
the stream listeners' accept backlog.

The full-size burst (256 dials per transport over real processes) is tests/test_scale.py.
"""

from __future__ import annotations

import asyncio

import pytest
from conftest import EchoNode, roundtrip, run
from test_handshake_limits import client_initial

from iac.errors import ConfigError
from iac.testing import eventually
from iac.transport import dial, listen
from iac.transport.base import TransportConfig
from iac.transport.quic import QuicListener
from iac.transport.quic.dialslots import DialSlots, dial_slots
from iac.transport.quic.listener import initial_dcid
from iac.transport.stream.listener import accept_backlog
from iac.wire.identity import Identity

# --- DialSlots, no network --------------------------------------------------------------------


def test_dial_slots_hold_the_bound_and_serve_waiters_in_turn() -> None:
    async def main() -> None:
        slots = DialSlots()
        order: list[int] = []

        async def dial(i: int) -> None:
            await slots.acquire(2)
            order.append(i)

        await slots.acquire(2)
        await slots.acquire(2)  # both slots taken
        tasks = [asyncio.create_task(dial(i)) for i in range(3)]
        await asyncio.sleep(0)
        assert (slots.in_flight, slots.waiting, order) == (2, 3, [])
        tasks[1].cancel()  # a waiter that gives up leaves the queue
        await asyncio.gather(tasks[1], return_exceptions=True)
        assert slots.waiting == 2
        slots.release()
        await tasks[0]
        assert (slots.in_flight, order) == (2, [0])
        slots.release()
        await tasks[2]
        assert (slots.in_flight, slots.waiting, order, slots.peak, slots.waited) == (2, 0, [0, 2], 2, 3)

    run(main())


def test_a_slot_granted_to_a_waiter_cancelled_meanwhile_goes_to_the_next() -> None:
    async def main() -> None:
        slots = DialSlots()
        await slots.acquire(1)
        first = asyncio.create_task(slots.acquire(1))
        second = asyncio.create_task(slots.acquire(1))
        await asyncio.sleep(0)
        slots.release()  # granted to ``first``, which is cancelled before it runs
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        await second
        assert (slots.in_flight, slots.waiting) == (1, 0)

    run(main())


def test_a_lower_limit_waits_until_fewer_run() -> None:
    async def main() -> None:
        slots = DialSlots()
        for _ in range(3):
            await slots.acquire(8)
        low = asyncio.create_task(slots.acquire(2))
        await asyncio.sleep(0)
        slots.release()
        await asyncio.sleep(0)
        assert not low.done()  # two still run
        slots.release()
        await low
        assert slots.in_flight == 2

    run(main())


def test_quic_dial_concurrency_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="quic_dial_concurrency"):
        TransportConfig(quic_dial_concurrency=0)


# --- dials over real sockets ------------------------------------------------------------------


def test_quic_dials_beyond_the_bound_wait_their_turn_and_all_complete() -> None:
    server = Identity.generate()

    async def main() -> None:
        node = EchoNode(server)
        listener = await listen("quic://127.0.0.1:0", server, node)
        config = TransportConfig(quic_dial_concurrency=2)
        try:
            clients = [Identity.generate() for _ in range(6)]
            conns = await asyncio.gather(
                *(dial(listener.addresses[0], c, expect=server.agent_id, config=config) for c in clients)
            )
            for conn, client in zip(conns, clients, strict=True):
                await roundtrip(conn, client)
                await conn.close()
            slots = dial_slots()
            assert slots.peak == 2 and slots.waited == 4 and slots.in_flight == 0
        finally:
            await listener.close()

    run(main())


def test_a_dial_waiting_for_its_turn_has_not_started() -> None:
    """A queued dial sends nothing (the listener sees no connection) until a slot frees; then
    it completes: its handshake timeout did not run while it waited."""
    server, client = Identity.generate(), Identity.generate()

    async def main() -> None:
        listener = await listen("quic://127.0.0.1:0", server, EchoNode(server))
        assert isinstance(listener, QuicListener)
        slots = dial_slots()
        await slots.acquire(1)  # the loop's one slot, held here
        config = TransportConfig(quic_dial_concurrency=1)
        task = asyncio.create_task(dial(listener.addresses[0], client, expect=server.agent_id, config=config))
        try:
            await eventually(lambda: slots.waiting == 1)
            assert listener.accepted == 0 and not task.done()
            slots.release()
            conn = await task
            await roundtrip(conn, client)
            await conn.close()
            assert listener.accepted == 1 and slots.in_flight == 0
        finally:
            task.cancel()
            await listener.close()

    run(main())


# --- the listener's queue: dials given up on ------------------------------------------------


def test_queued_dials_from_one_address_wait_side_by_side_and_a_dropped_ones_initials_open_nothing() -> None:
    server = Identity.generate()

    async def main() -> None:
        config = TransportConfig(handshake_concurrency=1, quic_retry="never", handshake_timeout=5.0)
        listener = await listen("quic://127.0.0.1:0", server, EchoNode(server), config=config)
        assert isinstance(listener, QuicListener)
        port = int(listener.addresses[0].rsplit(":", 1)[1])
        gate, lib_server = listener._admit_datagram, listener._server
        source = ("127.0.0.1", 40000)  # e.g. a node dialing from its listener's socket
        busy = object()
        try:
            listener._handshaking.add(busy)  # type: ignore[arg-type]  # the one slot is taken
            first, second = client_initial(port), client_initial(port)
            assert initial_dcid(first) != initial_dcid(second)
            assert not gate(lib_server, first, source)  # queued
            assert not gate(lib_server, first, source)  # its retransmission: still one in the queue
            assert not gate(lib_server, second, source)  # another dial from the same address
            assert list(listener._waiting) == [(source, initial_dcid(first)), (source, initial_dcid(second))]
            # the first waited past half of handshake_timeout: its client is about to give up
            srv, data, since, checked = listener._waiting[(source, initial_dcid(first))]
            listener._waiting[(source, initial_dcid(first))] = (srv, data, since - 10.0, checked)
            listener._handshaking.discard(busy)  # type: ignore[arg-type]
            listener._drain()
            assert listener.refused.get("handshake_backlog") == 1 and not listener._waiting
            assert listener._handshaking  # the second started
            assert not gate(lib_server, first, source)  # the dropped dial's Initial opens nothing
            assert listener.stale == 1 and not listener._waiting
            # remembered for handshake_timeout (the client gives up on it by then)
            now = asyncio.get_running_loop().time()
            assert listener._is_gone((source, initial_dcid(first)), now + 4.9)
            assert not listener._is_gone((source, initial_dcid(first)), now + 5.1)
        finally:
            listener._handshaking.discard(busy)  # type: ignore[arg-type]
            await listener.close()

    run(main())


def test_a_refused_dials_later_initials_open_no_connection() -> None:
    server = Identity.generate()

    async def main() -> None:
        listener = await listen("quic://127.0.0.1:0", server, EchoNode(server))
        assert isinstance(listener, QuicListener)
        port = int(listener.addresses[0].rsplit(":", 1)[1])
        source = ("127.0.0.1", 40001)
        data = client_initial(port)
        try:
            assert listener._admit_datagram(listener._server, data, source)  # a slot is free: taken
            assert listener._opening == (source, initial_dcid(data))
            conn = object()
            listener._dial_of[conn] = listener._opening  # type: ignore[index]  # as the factory does
            listener._handshaking.add(conn)  # type: ignore[arg-type]
            listener._handshake_done(conn, refused=True)  # type: ignore[arg-type]  # e.g. its HELLO timed out
            assert not listener._admit_datagram(listener._server, data, source)
            assert listener.stale == 1 and not listener._handshaking
        finally:
            await listener.close()

    run(main())


def test_stream_listeners_queue_a_burst_in_the_kernel() -> None:
    """The listen(2) backlog follows handshake_backlog, never below 128 (asyncio's default of
    100 made the kernel drop the SYNs of a burst beyond it)."""
    assert accept_backlog(TransportConfig()) == 4096
    assert accept_backlog(TransportConfig(handshake_backlog=0)) == 128
