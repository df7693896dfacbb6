"""The node with the persistent replay stores: SQLite (survives a restart), Redis (shared)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import run
from redis_server import start_redis
from test_pipeline import RawPeer

from iac.node.node import Context, Node
from iac.stores.redis import RedisReplayStore
from iac.stores.sqlite import SqliteReplayStore
from iac.wire._pb.iac_pb2 import MessageType
from iac.wire.identity import Identity
from iac.wire.message import encode_message_frame


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = start_redis(tmp_path_factory.mktemp("redis-node"))
    try:
        yield server.url
    finally:
        server.stop()


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
