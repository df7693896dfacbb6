"""iac.testing: the helpers a user's tests (and these) build on."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from conftest import run

import iac.testing
from iac.errors import ConfigError, ConnectionClosed
from iac.node.config import NodeConfig
from iac.node.node import Context, Node
from iac.protocol.clock import ManualClock
from iac.testing import DOWN, UP, UnixTap, eventually, eventually_sync, node_pair
from iac.transport.base import TransportConfig
from iac.wire._pb.iac_pb2 import MessageType
from iac.wire.dicts import DictionarySet, default_dictionary
from iac.wire.frames import FrameType


def test_the_package_exports_what_it_documents() -> None:
    assert iac.testing.ManualClock is ManualClock
    assert all(hasattr(iac.testing, name) for name in iac.testing.__all__)
    doc = iac.testing.__doc__ or ""
    for name in ("node_pair", "eventually", "eventually_sync", "ManualClock", "UnixTap", "UdpRelay"):
        assert name in iac.testing.__all__ and f"{name}`" in doc


def test_eventually_returns_the_value_once_the_condition_holds() -> None:
    async def main() -> None:
        box: list[int] = []
        asyncio.get_running_loop().call_soon(box.append, 7)
        assert await eventually(lambda: box and box[0]) == 7

    run(main())


def test_eventually_fails_at_its_deadline_with_the_state() -> None:
    async def main() -> None:
        with pytest.raises(AssertionError, match=r"not met within 0\.05 s: still 3"):
            await eventually(lambda: False, 0.05, message=lambda: "still 3")

    run(main())


def test_eventually_sync() -> None:
    calls = iter([0, 0, 5])
    assert eventually_sync(lambda: next(calls), interval=0.001) == 5
    with pytest.raises(AssertionError, match=r"within 0\.02 s: never"):
        eventually_sync(lambda: None, 0.02, interval=0.001, message="never")


@pytest.mark.parametrize("transport", ["unix", "tls"])
def test_node_pair_is_connected_and_cleaned_up(transport: str) -> None:
    async def main() -> None:
        async with node_pair(transport) as (alice, bob):
            assert alice.connected(bob.agent_id)
            assert bob.addresses[0].startswith(f"{transport}://")
            bob.on(MessageType.RUN)(lambda ctx: ctx.payload)
            assert (await alice.request(bob.agent_id, MessageType.RUN, "hi", timeout=5)).payload == "hi"
            sock = Path(bob.addresses[0].removeprefix("unix://")) if transport == "unix" else None
        if sock is not None:
            assert not sock.parent.exists()
        with pytest.raises(ConnectionClosed):
            await alice.send(bob.agent_id, MessageType.RUN)

    run(main())


def test_node_pair_without_connecting_and_with_identities() -> None:
    async def main() -> None:
        async with node_pair(connect=False) as pair:
            assert not pair.client.connected(pair.server.agent_id)
            assert pair.client.peer_book == {pair.server.agent_id: pair.server.addresses}
        with pytest.raises(ConfigError):
            async with node_pair("carrier-pigeon"):
                pass

    run(main())


def test_unix_tap_records_both_directions_through_pushed_dictionaries() -> None:
    async def main() -> None:
        # elide_prefixes off (a peer without elide/1): pushed dictionaries, full frames
        legacy = NodeConfig(
            transport=TransportConfig(
                dictionaries=DictionarySet([default_dictionary()]), elide_prefixes=False
            )
        )
        async with node_pair() as (_, bob), Node(config=legacy) as alice, UnixTap(bob.addresses[0]) as tap:

            @bob.on(MessageType.RUN)
            def echo(ctx: Context) -> object:
                return {"echo": ctx.payload}

            alice.add_peer(bob.agent_id, tap.url)  # the only way alice knows
            for i in range(3):
                reply = await alice.request(bob.agent_id, MessageType.RUN, {"i": i}, timeout=5)
                assert reply.payload == {"echo": {"i": i}}
            assert tap.errors == [] and tap.connections == 1
            assert [m.payload_json for m in tap.messages(UP)] == [f'{{"i":{i}}}' for i in range(3)]
            echoes = [f'{{"echo":{{"i":{i}}}}}' for i in range(3)]
            assert [m.payload_json for m in tap.messages(DOWN)] == echoes
            assert {t.type for t in tap.tapped(UP)} >= {FrameType.HELLO, FrameType.DICT, FrameType.MESSAGE}
            # after the DICT_ACK the messages go compressed with the pushed (derived) dictionary
            last = tap.tapped(UP, FrameType.MESSAGE)[-1].frame
            assert last.dict_id not in (None, 0, default_dictionary().dict_id)
            with pytest.raises(ConfigError):
                tap.tapped(UP, FrameType.HELLO)[0].message()
        with pytest.raises(ConfigError):
            UnixTap("tls://127.0.0.1:1")

    run(main())


def test_unix_tap_restores_elided_from_and_to() -> None:
    async def main() -> None:
        async with node_pair() as (_, bob), Node() as alice, UnixTap(bob.addresses[0]) as tap:

            @bob.on(MessageType.RUN)
            def echo(ctx: Context) -> object:
                return {"echo": ctx.payload}

            alice.add_peer(bob.agent_id, tap.url)
            reply = await alice.request(bob.agent_id, MessageType.RUN, {"i": 1}, timeout=5)
            assert reply.payload == {"echo": {"i": 1}}
            assert tap.errors == [] and FrameType.DICT not in {t.type for t in tap.frames}
            up, down = tap.tapped(UP, FrameType.MESSAGE)[0], tap.tapped(DOWN, FrameType.MESSAGE)[0]
            assert alice.agent_id.encode() not in up.frame.body  # the wire carries neither id
            assert bob.agent_id.encode() not in down.frame.body
            assert [(getattr(m, "from"), m.to) for m in tap.messages(UP)] == [(alice.agent_id, bob.agent_id)]
            assert [(getattr(m, "from"), m.to) for m in tap.messages(DOWN)] == [
                (bob.agent_id, alice.agent_id)
            ]

    run(main())
