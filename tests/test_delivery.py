"""Delivery: ACK_REQUESTED retransmission, dedup, ORDERED through the reorder buffer, the window.

Effectively-once: ACK_REQUESTED + ORDERED messages arrive each exactly once and in
order (a) over TLS through a TCP proxy that cuts the connection in the middle and
(b) over QUIC through a UDP relay that drops, duplicates and reorders datagrams.
The full 5,000-message runs are marked slow (IAC_SLOW=1); by default 500 run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

import pytest
from conftest import run

from iac.errors import DeliveryError, RemoteError, RequestTimeout
from iac.node.config import NodeConfig
from iac.node.node import Context, Node, Sent
from iac.testing import Impairment, UdpRelay, eventually
from iac.wire._pb.iac_pb2 import MessageType
from iac.wire.identity import Identity

SLOW = os.environ.get("IAC_SLOW") == "1"
N_FULL = 5000
N = N_FULL if SLOW else 500


class CuttingProxy:
    """A TCP proxy that aborts its first connection after ``cut_after`` bytes upstream."""

    def __init__(self, target_host: str, target_port: int, cut_after: int) -> None:
        self.target = (target_host, target_port)
        self.cut_after = cut_after
        self.cuts = 0
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        first = self.connections == 1
        ur, uw = await asyncio.open_connection(*self.target)
        self._writers += [w, uw]
        moved = 0

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, count: bool) -> None:
            nonlocal moved
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
                    if count and first:
                        moved += len(data)
                        if moved >= self.cut_after and self.cuts == 0:
                            self.cuts += 1
                            w.transport.abort()
                            uw.transport.abort()
                            return
            dst.close()

        await asyncio.gather(pipe(r, uw, True), pipe(ur, w, False))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in self._writers:
            w.transport.abort()


@contextlib.asynccontextmanager
async def receiver(
    config: NodeConfig | None = None, listen: str = "tls://127.0.0.1:0"
) -> AsyncIterator[tuple[Node, list[int]]]:
    async with Node(listen=[listen], config=config) as bob:
        got: list[int] = []

        @bob.on(MessageType.RUN)
        def record(ctx: Context) -> None:
            got.append(ctx.payload["i"])

        yield bob, got


async def send_all(alice: Node, peer: str, n: int, *, ordered: bool = True) -> list[Sent]:
    sent = [await alice.send(peer, MessageType.RUN, {"i": i}, ack=True, ordered=ordered) for i in range(n)]
    await asyncio.gather(*(s.wait() for s in sent))
    return sent


def _effectively_once_over_cut_tls(n: int) -> None:
    async def main() -> None:
        cfg = NodeConfig(sync_in_thread=False, retransmit_initial=0.1)
        async with receiver(cfg) as (bob, got), Node(config=cfg) as alice:
            host, port = bob.addresses[0].removeprefix("tls://").rsplit(":", 1)
            proxy = CuttingProxy(host, int(port), cut_after=40 * n)  # roughly in the middle
            pport = await proxy.start()
            alice.add_peer(bob.agent_id, f"tls://127.0.0.1:{pport}")
            sent = await send_all(alice, bob.agent_id, n)
            assert all(s.acked for s in sent)
            assert proxy.cuts == 1 and proxy.connections >= 2, "the connection was cut and re-made"
            assert got == list(range(n)), "each exactly once, in order"
            st = alice.stats()
            assert st.retransmits > 0 and st.unacked == 0 and st.delivery_failures == 0
            assert bob.stats().handled == n
            await proxy.close()

    run(main(), timeout=120)


@pytest.mark.slow  # reduced count by default; IAC_SLOW=1 runs the full one
def test_effectively_once_ordered_over_tls_with_the_connection_cut() -> None:
    _effectively_once_over_cut_tls(N)


def _effectively_once_over_lossy_quic(n: int) -> None:
    async def main() -> None:
        cfg = NodeConfig(sync_in_thread=False, retransmit_initial=0.5)
        async with receiver(cfg, "quic://127.0.0.1:0") as (bob, got), Node(config=cfg) as alice:
            port = int(bob.addresses[0].rsplit(":", 1)[1])
            imp = Impairment(loss=0.05, duplicate=0.05, reorder=0.05, reorder_delay=0.003)
            async with UdpRelay(("127.0.0.1", port), imp, seed=7) as relay:
                host, rport = relay.address
                alice.add_peer(bob.agent_id, f"quic://{host}:{rport}")
                await send_all(alice, bob.agent_id, n)
                assert got == list(range(n)), "each exactly once, in order"
                assert (
                    relay.stats.dropped_loss > 0 and relay.stats.duplicated > 0 and relay.stats.reordered > 0
                )
                assert bob.stats().handled == n

    run(main(), timeout=180)


@pytest.mark.slow  # reduced count by default; IAC_SLOW=1 runs the full one
def test_effectively_once_ordered_over_lossy_quic() -> None:
    _effectively_once_over_lossy_quic(N)


def test_ack_requested_unordered_each_exactly_once_over_cut_unix(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Unordered + ACK_REQUESTED: the receiver's connection is killed mid-run; every message is
    handled once (in any order)."""

    async def main() -> None:
        import shutil
        import tempfile

        d = tempfile.mkdtemp(prefix="iacd-")
        try:
            async with (
                receiver(NodeConfig(retransmit_initial=0.1), f"unix://{d}/s/b.sock") as (bob, got),
                Node(config=NodeConfig(retransmit_initial=0.1)) as alice,
            ):
                alice.add_peer(bob.agent_id, *bob.addresses)
                first = [
                    await alice.send(bob.agent_id, MessageType.RUN, {"i": i}, ack=True) for i in range(100)
                ]
                conn = bob.connection(alice.agent_id)
                assert conn is not None
                await conn.close()  # a cut from the receiver's side
                rest = [
                    await alice.send(bob.agent_id, MessageType.RUN, {"i": i}, ack=True)
                    for i in range(100, 200)
                ]
                await asyncio.gather(*(s.wait() for s in first + rest))
                assert sorted(got) == list(range(200))
        finally:
            shutil.rmtree(d, ignore_errors=True)

    run(main())


def test_unacknowledged_message_fails_with_delivery_error() -> None:
    async def main() -> None:
        cfg = NodeConfig(delivery_timeout=0.5, retransmit_initial=0.05, retransmit_max=0.1)
        async with Node(config=cfg) as alice:
            gone = Identity.generate().agent_id
            alice.add_peer(gone, "tls://127.0.0.1:1")
            sent = await alice.send(gone, MessageType.RUN, {"i": 1}, ack=True)
            with pytest.raises(DeliveryError):
                await sent.wait()
            assert alice.stats().delivery_failures == 1 and alice.stats().unacked == 0

    run(main())


def test_sender_keeps_at_most_max_in_flight_unacknowledged() -> None:
    async def main() -> None:
        gate = asyncio.Event()
        async with (
            Node(listen=["tls://127.0.0.1:0"]) as bob,
            Node(config=NodeConfig(max_in_flight=4)) as alice,
        ):

            @bob.on(MessageType.RUN)
            async def slow(ctx: Context) -> None:
                await gate.wait()

            alice.add_peer(bob.agent_id, *bob.addresses)
            sent = [await alice.send(bob.agent_id, MessageType.RUN, {"i": i}, ack=True) for i in range(4)]
            fifth = asyncio.ensure_future(alice.send(bob.agent_id, MessageType.RUN, {"i": 4}, ack=True))
            # A request needs a slot in the same window: with four unacknowledged it cannot go out and
            # times out locally (without the window it would go out, and bob answers a PING at once).
            with pytest.raises(RequestTimeout, match="4 requests in flight"):
                await alice.request(bob.agent_id, MessageType.PING, timeout=0.2)
            assert not fifth.done(), "the fifth waits for a free slot in the window"
            assert alice.stats().unacked == 4
            gate.set()
            await asyncio.gather(*(s.wait() for s in sent))
            await (await fifth).wait()

    run(main())


def test_retransmitted_request_is_answered_from_cache_not_handled_twice() -> None:
    async def main() -> None:
        calls: list[int] = []
        async with (
            Node(listen=["tls://127.0.0.1:0"]) as bob,
            Node(config=NodeConfig(retransmit_initial=0.05)) as alice,
        ):

            @bob.on(MessageType.RUN)
            async def handler(ctx: Context) -> object:
                calls.append(ctx.payload)
                # still running when the caller's retransmission arrives: it is dropped (IN_PROGRESS)
                await eventually(lambda: bob.stats().refused.get("duplicate", 0) > 0)
                return ctx.payload * 2

            alice.add_peer(bob.agent_id, *bob.addresses)
            reply = await alice.request(bob.agent_id, MessageType.RUN, 21, ack=True, timeout=5)
            assert reply.payload == 42
            assert calls == [21]
            assert alice.stats().retransmits > 0
            assert bob.stats().refused.get("duplicate", 0) > 0

    run(main())


def test_ack_requested_refused_message_raises_remote_error() -> None:
    async def main() -> None:
        async with Node(listen=["tls://127.0.0.1:0"]) as bob, Node() as alice:
            alice.add_peer(bob.agent_id, *bob.addresses)
            sent = await alice.send(bob.agent_id, MessageType.CREATE, {"x": 1}, ack=True)  # no handler
            with pytest.raises(RemoteError) as e:
                await sent.wait()
            assert e.value.code == "no_handler"

    run(main())
