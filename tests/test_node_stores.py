"""The node with the persistent replay stores: SQLite (survives a restart), Redis (shared)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import run
from redis_server import free_port, start_redis
from test_pipeline import RawPeer

from iac import NodeConfig
from iac.node.node import Context, Node
from iac.node.store import Check, StoreRunner
from iac.protocol.replay import ReplayGuard, Verdict
from iac.stores.redis import RedisReplayStore
from iac.stores.sqlite import SqliteReplayStore
from iac.testing import eventually
from iac.wire._pb.iac_pb2 import MessageType
from iac.wire.identity import Identity
from iac.wire.message import encode_message_frame

PersistentStore = SqliteReplayStore | RedisReplayStore


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = start_redis(tmp_path_factory.mktemp("redis-node"))
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", "redis"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., PersistentStore]]:
    """``open_store(**options)``: open (again) the same persistent store, as another process would."""
    made: list[PersistentStore] = []
    prefix = f"iac:test:{uuid.uuid4().hex}"
    url = request.getfixturevalue("redis_url") if request.param == "redis" else ""

    def open_one(**kw: Any) -> PersistentStore:
        if request.param == "sqlite":
            s: PersistentStore = SqliteReplayStore(tmp_path / "replay.sqlite", synchronous="NORMAL", **kw)
        else:
            s = RedisReplayStore(url, key_prefix=prefix, **kw)
        made.append(s)
        return s

    yield open_one
    for s in made:
        s.close()


def now_us() -> int:
    return time.time_ns() // 1000


def recording(node: Node) -> list[Any]:
    woke: list[Any] = []

    def record(ctx: Context) -> None:
        woke.append(ctx.payload)

    node.on(MessageType.RUN)(record)
    return woke


def test_sqlite_store_refuses_a_message_captured_before_a_restart(tmp_path: Path) -> None:
    async def main() -> None:
        me, sender = Identity.generate(), Identity.generate()
        db = tmp_path / "replay.sqlite"
        async with Node(me, listen=["tls://127.0.0.1:0"], replay_store=SqliteReplayStore(db)) as node:
            woke = recording(node)
            async with RawPeer.connect(node, sender) as peer:
                captured = encode_message_frame(sender, peer.message(MessageType.RUN, "once"))
                assert await peer.exchange(captured) == []
            assert woke == ["once"]
        # restart: new process state, same identity and store file
        async with Node(me, listen=["tls://127.0.0.1:0"], replay_store=SqliteReplayStore(db)) as node:
            woke = recording(node)
            async with RawPeer.connect(node, sender) as peer:
                assert await peer.exchange(captured) == []
            assert woke == []
            assert node.stats().refused == {"duplicate": 1}

    run(main())


def test_redis_store_is_shared_by_two_nodes(redis_url: str) -> None:
    """Two replicas of one agent behind one Redis: a message one accepted, the other refuses."""

    async def main() -> None:
        me, sender = Identity.generate(), Identity.generate()
        prefix = f"iac:test:{uuid.uuid4().hex}"
        store1 = RedisReplayStore(redis_url, key_prefix=prefix)
        store2 = RedisReplayStore(redis_url, key_prefix=prefix)
        async with (
            Node(me, listen=["tls://127.0.0.1:0"], replay_store=store1) as n1,
            Node(me, listen=["tls://127.0.0.1:0"], replay_store=store2) as n2,
        ):
            woke1, woke2 = recording(n1), recording(n2)
            async with RawPeer.connect(n1, sender) as p1, RawPeer.connect(n2, sender) as p2:
                frame = encode_message_frame(sender, p1.message(MessageType.RUN, "once"))
                assert await p1.exchange(frame) == []
                assert await p2.exchange(frame) == []
            assert woke1 == ["once"] and woke2 == []
            assert n2.stats().refused == {"duplicate": 1}

    run(main())


def test_a_running_handler_keeps_its_reservation_past_the_lease(
    open_store: Callable[..., PersistentStore],
) -> None:
    """The node renews the lease of an id while its handler runs: for another process sharing the
    store the id stays in progress four leases on, and is done once handled. (Sent without
    ACK_REQUESTED: no retransmission reserves it again meanwhile.)"""

    async def main() -> None:
        lease = 300_000
        async with (
            Node(listen=["tls://127.0.0.1:0"], replay_store=open_store(reservation_lease_us=lease)) as rx,
            Node() as tx,
        ):
            go = asyncio.Event()
            keys: list[tuple[str, int, int]] = []

            @rx.on(MessageType.RUN)
            async def hold(ctx: Context) -> None:
                keys.append((tx.agent_id, ctx.message.session_id, ctx.message.msg_id))
                await go.wait()

            tx.add_peer(rx.agent_id, *rx.addresses)
            await tx.send(rx.agent_id, MessageType.RUN, {})
            await eventually(lambda: keys)
            await asyncio.sleep(4 * lease / 1e6)  # the time under test: four leases pass
            other = open_store(reservation_lease_us=lease)  # another process on the same store
            assert other.reserve(*keys[0], now_us()) is Verdict.IN_PROGRESS
            go.set()
            await eventually(lambda: other.check_and_mark(*keys[0], now_us()) is Verdict.DUPLICATE)
            assert len(keys) == 1

    run(main())


def test_an_id_the_node_holds_stays_in_progress_when_its_lease_lapsed(
    open_store: Callable[..., PersistentStore],
) -> None:
    """A lease lapsed while the node still holds the id (the store was out of reach, the loop
    stalled): the store calls a copy new, the node does not."""

    async def main() -> None:
        runner = StoreRunner(ReplayGuard(open_store(reservation_lease_us=1_000)))
        key = ("a" * 64, 1, 1)
        t = now_us()
        assert await runner.check([Check(key, False)], t) == [Verdict.NEW]
        assert await runner.check([Check(key, False)], t + 10_000) == [Verdict.IN_PROGRESS]
        assert runner.held == 1
        runner.commit(key, t + 10_001)
        assert runner.held == 0
        assert await runner.check([Check(key, False)], t + 10_002) == [Verdict.DUPLICATE]
        runner.close()

    run(main())


def test_a_restarted_node_continues_an_ordered_session_at_once(
    open_store: Callable[..., PersistentStore],
) -> None:
    """A node restarted on the same store starts the reorder buffer of a session it saw before
    after the session's highest id done: the next messages are handled at once, in order."""

    async def main() -> None:
        me = Identity.generate()
        cfg = NodeConfig(delivery_timeout=10, retransmit_initial=0.1, retransmit_max=0.5)
        listen = [f"tls://127.0.0.1:{free_port()}"]
        got: list[Any] = []
        async with Node(config=cfg) as tx:
            async with Node(me, listen=listen, replay_store=open_store(), config=cfg) as rx:
                rx.on(MessageType.RUN)(lambda ctx: got.append(ctx.payload))
                tx.add_peer(rx.agent_id, *rx.addresses)
                first = [
                    await tx.send(me.agent_id, MessageType.RUN, i, ack=True, ordered=True) for i in range(5)
                ]
                await asyncio.gather(*(s.wait() for s in first))
            async with Node(me, listen=listen, replay_store=open_store(), config=cfg) as rx:
                rx.on(MessageType.RUN)(lambda ctx: got.append(ctx.payload))
                later = [
                    await tx.send(me.agent_id, MessageType.RUN, i, ack=True, ordered=True)
                    for i in range(5, 10)
                ]
                done, _ = await asyncio.wait([asyncio.ensure_future(s.wait()) for s in later], timeout=3)
                assert len(done) == 5, f"{5 - len(done)} of 5 not acknowledged 3 s after they were sent"
                assert got == list(range(10))
                assert rx.stats().gaps == 0

    run(main())
