"""Streaming replies: a handler that is an async generator answers with parts, each signed,
replay-checked and delivered in order, with end-to-end credit; closing or cancelling stops it."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from conftest import run

from iac import Node, NodeConfig, RemoteError, RequestTimeout
from iac.testing import eventually, node_pair


@pytest.mark.parametrize("transport", ["unix", "tls", "quic"])
def test_parts_arrive_in_order_and_the_end_is_explicit(transport: str) -> None:
    async def main() -> None:
        async with node_pair(transport) as pair:
            server, client = pair.server, pair.client

            @server.on("RUN")
            async def count(ctx):  # type: ignore[no-untyped-def]
                for i in range(ctx.payload["n"]):
                    yield {"i": i}

            got = [p.payload["i"] async for p in client.stream(server.agent_id, "RUN", {"n": 50}, window=4)]
            assert got == list(range(50))
            assert [p.payload async for p in client.stream(server.agent_id, "RUN", {"n": 0})] == []
            stats = server.stats()
            assert stats.replies_sent == 50 and stats.handled == 2

    run(main())


def test_the_producer_never_runs_more_than_the_window_ahead() -> None:
    async def main() -> None:
        async with node_pair() as pair:
            server, client = pair.server, pair.client
            produced, taken, ahead = 0, 0, []

            @server.on("RUN")
            async def gen(ctx):  # type: ignore[no-untyped-def]
                nonlocal produced
                for i in range(40):
                    produced += 1
                    ahead.append(produced - taken)
                    yield i

            async for part in client.stream(server.agent_id, "RUN", window=5):
                taken += 1  # the consumer took this part
                assert part.payload == taken - 1
                await asyncio.sleep(0.005)  # a slow consumer: the producer must wait for credit
            assert taken == 40 and produced == 40
            assert max(ahead) <= 5 + 1, ahead  # a window of parts in flight, plus the one being made

    run(main())


def test_closing_the_iterator_cancels_the_handler() -> None:
    async def main() -> None:
        async with node_pair() as pair:
            server, client = pair.server, pair.client
            stopped = asyncio.Event()

            @server.on("RUN")
            async def forever(ctx):  # type: ignore[no-untyped-def]
                try:
                    i = 0
                    while True:
                        yield i
                        i += 1
                finally:
                    stopped.set()

            async with contextlib.aclosing(client.stream(server.agent_id, "RUN", window=2)) as parts:
                async for part in parts:
                    if part.payload == 3:
                        break
            await asyncio.wait_for(stopped.wait(), 5)
            await eventually(lambda: server.stats().cancelled == 1)

    run(main())


def test_errors_deadlines_and_misuse_are_explicit() -> None:
    async def main() -> None:
        async with node_pair() as pair:
            server, client = pair.server, pair.client

            @server.on("RUN")
            async def fails(ctx):  # type: ignore[no-untyped-def]
                yield 1
                yield 2
                raise RuntimeError("boom")

            @server.on("CREATE")
            async def slow(ctx):  # type: ignore[no-untyped-def]
                yield 1
                await asyncio.sleep(30)
                yield 2

            server.on("TERMINATE")(lambda ctx: {"plain": True})  # a plain handler: one part

            got: list[int] = []
            with pytest.raises(RemoteError) as err:
                async for p in client.stream(server.agent_id, "RUN"):
                    got.append(p.payload)
            assert got == [1, 2] and err.value.code == "internal"  # the error comes after the parts

            with pytest.raises(RequestTimeout, match=r"no part for 0\.3 s"):
                async for p in client.stream(server.agent_id, "CREATE", idle_timeout=0.3):
                    assert p.payload == 1
            await eventually(lambda: server.stats().cancelled == 1)  # the idle consumer cancelled it

            assert [p.payload async for p in client.stream(server.agent_id, "TERMINATE")] == [{"plain": True}]
            assert (await client.request(server.agent_id, "RUN", timeout=5)).payload == 1  # its first part
            with pytest.raises(RemoteError) as err:
                async for _ in client.stream(server.agent_id, "BROADCAST"):
                    pass
            assert err.value.code == "no_handler"

    run(main())


def test_a_stream_ends_when_the_connection_does() -> None:
    async def main() -> None:
        async with Node(listen="tls://127.0.0.1:0") as server, Node(config=NodeConfig()) as client:
            client.add_peer(server.agent_id, *server.addresses)

            @server.on("RUN")
            async def forever(ctx):  # type: ignore[no-untyped-def]
                yield 0
                await asyncio.sleep(30)

            with pytest.raises(Exception) as err:  # the typed error is asserted below
                async for _ in client.stream(server.agent_id, "RUN"):
                    conn = client.connection(server.agent_id)
                    assert conn is not None
                    await conn.close()
            assert type(err.value).__name__ == "ConnectionClosed"

    run(main())


def test_a_principal_travels_signed_and_is_bounded() -> None:
    async def main() -> None:
        async with node_pair() as pair:
            server, client = pair.server, pair.client
            server.on("RUN")(lambda ctx: {"principal": ctx.principal, "sender": ctx.sender})
            reply = await client.request(server.agent_id, "RUN", principal="alice@example.org", timeout=5)
            assert reply.payload == {"principal": "alice@example.org", "sender": client.agent_id}
            assert (await client.request(server.agent_id, "RUN", timeout=5)).payload["principal"] == ""
            for bad in ("x" * 257, "line\nbreak"):
                with pytest.raises(RemoteError) as err:
                    await client.request(server.agent_id, "RUN", principal=bad, timeout=5)
                assert err.value.code == "bad_request" and "principal" in err.value.message
            parts = [p.payload async for p in client.stream(server.agent_id, "RUN", principal="bob")]
            assert parts == [{"principal": "bob", "sender": client.agent_id}]

    run(main())


def test_a_node_announces_stream_1_in_its_hello() -> None:
    """Every node answers STREAM requests, so its HELLO lists ``stream/1`` (docs/PROTOCOL.md, section
    18, "Capabilities"), beside what the configuration announces."""
    from iac.transport import TransportConfig, dial
    from iac.wire.identity import Identity

    async def main() -> None:
        config = NodeConfig(transport=TransportConfig(capabilities=("x-demo/1",)))
        async with Node(listen="tls://127.0.0.1:0", config=config) as node:
            conn = await dial(node.addresses[0], Identity.generate(), expect=node.agent_id)
            try:
                caps = list(conn.peer.hello.capabilities)
            finally:
                await conn.close()
        assert "stream/1" in caps and "x-demo/1" in caps
        assert caps.count("stream/1") == 1

    run(main())
