"""The seeded UDP impairment relay."""

from __future__ import annotations

import asyncio

import pytest
from conftest import run

from iac.errors import ConfigError
from iac.testing import Impairment, UdpRelay, eventually

Addr = tuple[str, int]


class Sink(asyncio.DatagramProtocol):
    """Records datagrams; optionally echoes them."""

    def __init__(self, echo: bool = False) -> None:
        self.echo = echo
        self.got: list[tuple[bytes, Addr]] = []
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: Addr) -> None:
        self.got.append((data, addr))
        if self.echo and self.transport is not None:
            self.transport.sendto(data, addr)


async def endpoint(echo: bool = False) -> tuple[Sink, Addr]:
    loop = asyncio.get_running_loop()
    transport, proto = await loop.create_datagram_endpoint(lambda: Sink(echo), local_addr=("127.0.0.1", 0))
    host, port = transport.get_extra_info("sockname")[:2]
    return proto, (host, port)


async def through(
    impairment: Impairment, n: int, *, seed: int = 1, max_queue: int = 4096, echo: bool = False
) -> tuple[UdpRelay, Sink, Sink]:
    target, target_addr = await endpoint(echo=echo)
    relay = UdpRelay(target_addr, impairment, seed=seed, max_queue=max_queue)
    relay_addr = await relay.start()
    client, _ = await endpoint()
    assert client.transport is not None
    for i in range(n):
        client.transport.sendto(i.to_bytes(4, "big"), relay_addr)
        if i % 20 == 19:  # pace the sender so that no socket buffer overflows
            await eventually(lambda i=i: relay.stats.received >= i + 1)
    await eventually(lambda: relay.stats.received >= n)
    return relay, target, client


def test_clean_relay_forwards_both_ways() -> None:
    async def main() -> None:
        relay, target, client = await through(Impairment(), 100, echo=True)
        await eventually(lambda: len(client.got) == 100)
        assert sorted(d for d, _ in target.got) == [i.to_bytes(4, "big") for i in range(100)]
        assert relay.stats.forwarded == 200
        # the target sees the relay's upstream port, not the client's
        assert {a for _, a in target.got} != {relay.address}
        await relay.close()

    run(main())


def test_loss_is_seeded_and_counted() -> None:
    async def once(seed: int) -> tuple[int, list[bytes]]:
        relay, target, _ = await through(Impairment(loss=0.3), 1000, seed=seed)
        await eventually(lambda: len(target.got) == relay.stats.forwarded)
        dropped = relay.stats.dropped_loss
        assert dropped + relay.stats.forwarded == 1000
        await relay.close()
        return dropped, [d for d, _ in target.got]

    async def main() -> None:
        a = await once(5)
        b = await once(5)
        c = await once(6)
        assert 200 < a[0] < 400
        assert a == b
        assert a[1] != c[1]

    run(main())


def test_duplication_and_delay() -> None:
    async def main() -> None:
        relay, target, _ = await through(Impairment(delay=0.01, duplicate=1.0), 50)
        await eventually(lambda: len(target.got) == 100)
        assert relay.stats.duplicated == 50
        assert sorted(d for d, _ in target.got) == sorted(2 * [i.to_bytes(4, "big") for i in range(50)])
        await relay.close()

    run(main())


def test_reorder_changes_order_but_loses_nothing() -> None:
    async def main() -> None:
        relay, target, _ = await through(Impairment(delay=0.001, reorder=0.3, reorder_delay=0.01), 200)
        await eventually(lambda: len(target.got) == 200)
        order = [int.from_bytes(d, "big") for d, _ in target.got]
        assert sorted(order) == list(range(200))
        assert order != list(range(200))
        assert relay.stats.reordered > 0
        await relay.close()

    run(main())


def test_queue_is_bounded() -> None:
    async def main() -> None:
        relay, target, _ = await through(Impairment(delay=0.2), 100, max_queue=10)
        assert relay.stats.dropped_queue == 90
        await eventually(lambda: len(target.got) == 10)
        await relay.close()

    run(main())


def test_capture_and_replay_from_a_fresh_port() -> None:
    async def main() -> None:
        target, target_addr = await endpoint()
        relay = UdpRelay(target_addr)
        relay_addr = await relay.start()
        client, _ = await endpoint()
        assert client.transport is not None
        relay.start_capture(limit=3)
        for i in range(5):
            client.transport.sendto(bytes([i]), relay_addr)
        await eventually(lambda: len(target.got) == 5)
        captured = relay.stop_capture()
        assert [c.data for c in captured] == [b"\x00", b"\x01", b"\x02"]
        await relay.replay(captured)
        await eventually(lambda: len(target.got) == 8)
        assert [d for d, _ in target.got[5:]] == [b"\x00", b"\x01", b"\x02"]
        assert target.got[5][1] != target.got[0][1]
        assert relay.stats.replayed == 3
        await relay.close()

    run(main())


def test_bad_impairment_is_refused() -> None:
    with pytest.raises(ConfigError):
        Impairment(loss=1.5)
    with pytest.raises(ConfigError):
        Impairment(delay=-1)
