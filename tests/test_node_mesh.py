"""The node as a relay and a broadcaster: FORWARD on real loopback connections.

A — B — C, where C listens only on a UNIX socket that only B dials: A reaches C
through B (``via=`` or a route), C verifies A's signature, and the reply comes
back the same way. A raw relay that alters one byte is caught at C; policy
denials, hop limits and loops are refused and counted. Broadcasts reach every
node's handler exactly once.

Barriers, not sleeps: a node handles one connection's frames in order, so a
request answered over the same connection proves that everything sent before
it was processed.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import message_of, run

from iac.errors import ConfigError, IacError
from iac.node.config import NodeConfig, NodeStats
from iac.node.node import Context, Node
from iac.protocol.routing import RelayPolicy, parse_forward, wrap_forward
from iac.testing import eventually
from iac.transport import dial, listen
from iac.transport.base import Connection
from iac.wire._pb.iac_pb2 import Forward, MessageType
from iac.wire.frames import FrameType, encode_frame
from iac.wire.identity import Identity
from iac.wire.message import Session, build_message, encode_message_frame, sign_message

RELAY = RelayPolicy(relay_unicast=True)


@contextlib.asynccontextmanager
async def tmpdir() -> AsyncIterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="iacm-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@contextlib.asynccontextmanager
async def line(
    relay: RelayPolicy = RELAY, a_config: NodeConfig | None = None
) -> AsyncIterator[tuple[Node, Node, Node]]:
    """A — B — C on loopback: C listens on a UNIX socket only B knows; A knows only B."""
    async with (
        tmpdir() as d,
        Node(listen=[f"unix://{d}/c.sock"]) as c,
        Node(listen=["tls://127.0.0.1:0"], config=NodeConfig(relay_policy=relay)) as b,
        Node(config=a_config) as a,
    ):
        b.add_peer(c.agent_id, *c.addresses)
        await b.connect(c.agent_id)
        a.add_peer(b.agent_id, *b.addresses)
        await a.connect(b.agent_id)
        yield a, b, c


def echo_on(node: Node, seen: list[Any] | None = None) -> None:
    @node.on(MessageType.RUN)
    async def echo(ctx: Context) -> object:
        if seen is not None:
            seen.append(ctx.payload)
        return {"echo": ctx.payload, "from": ctx.sender}


async def barrier(a: Node, b: Node) -> None:
    """A PING request from a to its neighbour b: everything a sent b before is processed."""
    await a.request(b.agent_id, MessageType.PING, timeout=5)


# --- relayed routing ------------------------------------------------------------------------------


def test_request_via_relay_and_reply_routed_back() -> None:
    async def main() -> None:
        async with line() as (a, b, c):
            echo_on(c)
            reply = await a.request(c.agent_id, MessageType.RUN, {"x": 1}, via=b.agent_id, timeout=5)
            assert reply.payload == {"echo": {"x": 1}, "from": a.agent_id}  # C saw A, not B
            assert reply.sender == c.agent_id
            assert not a.connected(c.agent_id) and not c.connected(a.agent_id)
            assert b.stats().routing["relayed"] == 2  # the request and the reply
            assert c.stats().routing["delivered"] == 1 and a.stats().routing["delivered"] == 1
            # A one-way message with ACK_REQUESTED: the ACK routes back too.
            sent = await a.send(c.agent_id, MessageType.RUN, "acked", ack=True, via=b.agent_id)
            await asyncio.wait_for(sent.wait(), 5)
            # A remote call through the relay.
            c.expose(lambda x: x * 2, name="double")
            assert await a.invoke(c.agent_id, "double", [21], via=b.agent_id, timeout=5) == 42
            for n in (a, b, c):
                assert n.stats().route_refused == {}

    run(main())


def test_static_route_and_reply_under_a_destination_only_policy() -> None:
    """B relays only toward C; C's reply to A still passes (it answers a request B relayed)."""

    async def main() -> None:
        async with (
            tmpdir() as d,
            Node(listen=[f"unix://{d}/c.sock"]) as c,
            Node(listen=[f"unix://{d}/e.sock"]) as e,
        ):
            policy = RelayPolicy(relay_unicast=True, destinations=frozenset({c.agent_id}))
            cfg = NodeConfig(relay_policy=policy)
            async with Node(listen=["tls://127.0.0.1:0"], config=cfg) as b, Node() as a:
                echo_on(c)
                echo_on(e)
                for peer in (c, e):
                    b.add_peer(peer.agent_id, *peer.addresses)
                    await b.connect(peer.agent_id)
                a.add_peer(b.agent_id, *b.addresses)
                a.add_route(c.agent_id, b.agent_id)
                assert a.routes == {c.agent_id: b.agent_id}
                reply = await a.request(c.agent_id, MessageType.RUN, "r", timeout=5)
                assert reply.payload == {"echo": "r", "from": a.agent_id}
                # B relays toward nobody else.
                await a.send(e.agent_id, MessageType.RUN, "no", via=b.agent_id)
                await barrier(a, b)
                assert b.stats().route_refused == {"relay_denied": 1}
                assert e.stats().handled == 0
                a.remove_route(c.agent_id)
                assert a.routes == {}
                with pytest.raises(ConfigError):
                    a.add_route(b.agent_id, b.agent_id)

    run(main())


def test_relay_dials_a_known_destination_it_is_not_connected_to() -> None:
    async def main() -> None:
        async with (
            tmpdir() as d,
            Node(listen=[f"unix://{d}/c.sock"]) as c,
            Node(listen=["tls://127.0.0.1:0"], config=NodeConfig(relay_policy=RELAY)) as b,
            Node() as a,
        ):
            echo_on(c)
            b.add_peer(c.agent_id, *c.addresses)  # known, not connected
            a.add_peer(b.agent_id, *b.addresses)
            reply = await a.request(c.agent_id, MessageType.RUN, 7, via=b.agent_id, timeout=5)
            assert reply.payload == {"echo": 7, "from": a.agent_id}
            assert b.connected(c.agent_id)
            assert b.stats().route_refused == {}

    run(main())


def test_relay_policy_denial_is_counted() -> None:
    async def main() -> None:
        async with line(RelayPolicy()) as (a, b, c):  # the default: no unicast relaying
            seen: list[Any] = []
            echo_on(c, seen)
            await a.send(c.agent_id, MessageType.RUN, "x", via=b.agent_id)
            await barrier(a, b)
            assert b.stats().route_refused == {"relay_denied": 1}
            assert seen == [] and c.stats().routing["delivered"] == 0

    run(main())


def test_hop_limit_is_refused_and_counted() -> None:
    async def main() -> None:
        async with line(a_config=NodeConfig(unicast_hop_limit=1)) as (a, b, c):
            seen: list[Any] = []
            echo_on(c, seen)
            await a.send(c.agent_id, MessageType.RUN, "x", via=b.agent_id)
            await barrier(a, b)
            assert b.stats().route_refused == {"hop_limit_exhausted": 1}
            assert seen == []

    run(main())


def test_loop_bad_path_and_needless_forward_are_refused() -> None:
    async def main() -> None:
        async with line() as (_a, b, c):
            x = Identity.generate()
            conn = await dial(b.addresses[0], x, expect=b.agent_id)
            session = Session()
            try:

                def inner(to: str) -> bytes:
                    msg = build_message(sender=x.agent_id, to=to, msg_type=MessageType.RUN, session=session,
                                        timestamp_us=b.clock.now_us(), payload_json='"x"')  # fmt: skip
                    return sign_message(x, msg)

                other = Identity.generate().agent_id
                frames = [
                    wrap_forward(inner(c.agent_id), 5, [x.agent_id, b.agent_id, other, x.agent_id]),  # loop
                    wrap_forward(inner(c.agent_id), 5, [other, x.agent_id]),  # does not start at the origin
                    wrap_forward(inner(b.agent_id), 5, [x.agent_id]),  # no relay crossed: MESSAGE frame
                ]
                for body in frames:
                    await conn.send(encode_frame(FrameType.FORWARD, body))
                ping = build_message(sender=x.agent_id, to=b.agent_id, msg_type=MessageType.PING,
                                     session=session, timestamp_us=b.clock.now_us(),
                                     deadline_us=b.clock.now_us() + 5_000_000)  # fmt: skip
                await conn.send(encode_message_frame(x, ping))
                inc = await asyncio.wait_for(conn.recv(), 5)
                assert message_of(inc) is not None and message_of(inc).reply_to == ping.msg_id
            finally:
                await conn.close()
            st = b.stats()
            assert st.route_refused == {"routing_loop": 1, "bad_forward_path": 1}
            assert st.refused == {"forward_not_relayed": 1}

    run(main())


class TamperingRelay:
    """A raw relay (no Node): passes Forwards between A and C, and flips one byte of any origin
    message that contains ``b"tamper"``."""

    def __init__(self, c: Node) -> None:
        self.identity = Identity.generate()
        self.c = c
        self.to_c: Connection | None = None
        self.to_a: Connection | None = None
        self.tampered = 0
        self.tasks: list[asyncio.Task[None]] = []

    def rewrap(self, body: bytes) -> bytes:
        env = parse_forward(body)
        message = env.message
        if b"tamper" in message:
            message = message.replace(b"tamper", b"tamp3r")
            self.tampered += 1
        return wrap_forward(message, env.hop_limit - 1, [*env.path, self.identity.agent_id])

    async def pump(self, src: Connection, dst: Callable[[], Connection | None]) -> None:
        with contextlib.suppress(IacError):
            while True:
                inc = await src.recv()
                out = dst()
                if inc.frame.type == FrameType.FORWARD and out is not None:
                    await out.send(encode_frame(FrameType.FORWARD, self.rewrap(inc.frame.body)))

    async def on_connection(self, conn: Connection) -> None:
        self.to_a = conn
        await self.pump(conn, lambda: self.to_c)

    async def start(self) -> Any:
        lst = await listen("tls://127.0.0.1:0", self.identity, self.on_connection)
        self.to_c = await dial(self.c.addresses[0], self.identity, expect=self.c.agent_id)
        self.tasks.append(asyncio.ensure_future(self.pump(self.to_c, lambda: self.to_a)))
        return lst


def test_relay_that_alters_a_byte_is_caught_at_the_receiver() -> None:
    async def main() -> None:
        async with tmpdir() as d, Node(listen=[f"unix://{d}/c.sock"]) as c, Node() as a:
            seen: list[Any] = []
            echo_on(c, seen)
            relay = TamperingRelay(c)
            lst = await relay.start()
            try:
                rid = relay.identity.agent_id
                a.add_peer(rid, *lst.addresses)
                await a.send(c.agent_id, MessageType.RUN, "tamper with me", via=rid)
                # The barrier goes the same way: C handles the relay's frames in order.
                reply = await a.request(c.agent_id, MessageType.RUN, "honest", via=rid, timeout=5)
                assert reply.payload == {"echo": "honest", "from": a.agent_id}
                assert relay.tampered == 1
                assert seen == ["honest"]
                assert c.stats().route_refused == {"bad_signature": 1}
            finally:
                for t in relay.tasks:
                    t.cancel()
                if relay.to_c is not None:
                    await relay.to_c.close()
                await lst.close()

    run(main())


# --- broadcast ------------------------------------------------------------------------------------


def quiet(stats: list[NodeStats]) -> bool:
    """Every Forward sent has been received and judged somewhere."""
    sent = sum(s.routing["forwarded"] for s in stats)
    got = sum(s.routing["delivered"] + s.routing["duplicates"] + sum(s.route_refused.values()) for s in stats)
    return sent == got


@contextlib.asynccontextmanager
async def mesh(edges: list[tuple[int, int]], n: int, configs: dict[int, NodeConfig] | None = None
               ) -> AsyncIterator[list[Node]]:  # fmt: skip
    async with contextlib.AsyncExitStack() as stack:
        nodes = [
            await stack.enter_async_context(Node(listen=["tls://127.0.0.1:0"], config=(configs or {}).get(i)))
            for i in range(n)
        ]
        for i, j in edges:
            nodes[i].add_peer(nodes[j].agent_id, *nodes[j].addresses)
            await nodes[i].connect(nodes[j].agent_id)
        await eventually(
            lambda: all(
                nd.stats().connections == deg for nd, deg in zip(nodes, degrees(edges, n), strict=True)
            )
        )
        yield nodes


def degrees(edges: list[tuple[int, int]], n: int) -> list[int]:
    d = [0] * n
    for i, j in edges:
        d[i] += 1
        d[j] += 1
    return d


def test_broadcast_reaches_every_handler_exactly_once() -> None:
    async def main() -> None:
        n = 6
        edges = [(i, (i + 1) % n) for i in range(n)] + [(0, 3), (1, 4)]  # a ring with chords
        async with mesh(edges, n) as nodes:
            got: list[Counter[tuple[str, int]]] = [Counter() for _ in nodes]
            for idx, node in enumerate(nodes):

                def handler(ctx: Context, idx: int = idx) -> object:
                    got[idx][(ctx.sender, ctx.payload["k"])] += 1
                    return {"ignored": True}  # a broadcast is never answered

                node.on(MessageType.BROADCAST)(handler)
            for k in range(12):
                origin = nodes[k % n]
                sent = await origin.broadcast(MessageType.BROADCAST, {"k": k})
                assert sent.peer == ""
            await eventually(lambda: sum(sum(c.values()) for c in got) == 12 * (n - 1))
            await eventually(lambda: quiet([nd.stats() for nd in nodes]))
            for idx, node in enumerate(nodes):
                expected = {(nodes[k % n].agent_id, k): 1 for k in range(12) if k % n != idx}
                assert dict(got[idx]) == expected
                st = node.stats()
                assert st.route_refused == {} and st.errors_sent == {} and st.replies_sent == 0
            assert sum(nd.stats().routing["duplicates"] for nd in nodes) > 0  # the chords made copies

    run(main())


def test_broadcast_relay_policy_off_stops_the_flood_at_that_node() -> None:
    async def main() -> None:
        cfg = {1: NodeConfig(relay_policy=RelayPolicy(relay_broadcasts=False))}
        async with mesh([(0, 1), (1, 2)], 3, cfg) as nodes:
            got: list[list[Any]] = [[], [], []]
            for idx, node in enumerate(nodes):
                node.on(MessageType.BROADCAST)(lambda ctx, idx=idx: got[idx].append(ctx.payload))
            await nodes[0].broadcast(MessageType.BROADCAST, "hello")
            await eventually(lambda: got[1] == ["hello"])
            await barrier(nodes[0], nodes[1])
            assert got == [[], ["hello"], []]
            assert nodes[1].stats().route_refused == {"relay_denied": 1}

    run(main())


def test_broadcast_hop_limit_ends_the_flood() -> None:
    async def main() -> None:
        edges = [(0, 1), (1, 2), (2, 3)]
        async with mesh(edges, 4, {0: NodeConfig(broadcast_hop_limit=2)}) as nodes:
            got: list[list[Any]] = [[] for _ in nodes]
            for idx, node in enumerate(nodes):
                node.on(MessageType.BROADCAST)(lambda ctx, idx=idx: got[idx].append(ctx.payload))
            await nodes[0].broadcast(MessageType.BROADCAST, 1)
            await eventually(lambda: got[2] == [1])
            await eventually(lambda: quiet([nd.stats() for nd in nodes]))
            assert got == [[], [1], [1], []]
            assert nodes[2].stats().routing["flood_ends"] == 1

    run(main())


def test_broadcast_refuses_node_owned_types_and_unsealable() -> None:
    async def main() -> None:
        async with Node() as node:
            with pytest.raises(ConfigError):
                await node.broadcast(MessageType.REPLY, None)
            sent = await node.broadcast(MessageType.BROADCAST, "alone")  # no peers: goes nowhere
            assert sent.msg_id == 1

    run(main())


def test_forward_frame_from_a_raw_peer_delivers_a_broadcast() -> None:
    async def main() -> None:
        async with line() as (_a, b, _c):
            got: list[Any] = []
            b.on(MessageType.BROADCAST)(lambda ctx: got.append((ctx.sender, ctx.payload)))
            x = Identity.generate()
            conn = await dial(b.addresses[0], x, expect=b.agent_id)
            try:
                session = Session()
                msg = build_message(sender=x.agent_id, to="", msg_type=MessageType.BROADCAST, session=session,
                                    timestamp_us=b.clock.now_us(), payload_json='"hi"')  # fmt: skip
                fwd = Forward(hop_limit=4, path=[x.agent_id], message=sign_message(x, msg))
                for _ in range(2):  # the copy is dropped as a duplicate
                    await conn.send(encode_frame(FrameType.FORWARD, fwd.SerializeToString()))
                ping = build_message(sender=x.agent_id, to=b.agent_id, msg_type=MessageType.PING,
                                     session=session, timestamp_us=b.clock.now_us(),
                                     deadline_us=b.clock.now_us() + 5_000_000)  # fmt: skip
                await conn.send(encode_message_frame(x, ping))
                await asyncio.wait_for(conn.recv(), 5)
            finally:
                await conn.close()
            await eventually(lambda: bool(got))
            assert got == [(x.agent_id, "hi")]
            st = b.stats()
            assert st.routing["duplicates"] == 1 and st.routing["relayed"] == 2  # sent on to A and C

    run(main())
