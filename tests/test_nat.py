"""Through NATs: one UDP socket per node (dials leave from the QUIC listener's socket)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import message_of, run

from iac.cli.status import render
from iac.errors import ConfigError
from iac.node.config import NodeConfig
from iac.node.node import Node
from iac.testing import eventually
from iac.testing.nat import NatLab, NatScene
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
    conn = node.connection(peer)
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


# --- candidates in records and messages ---------------------------------------------------------


def test_record_candidates_round_trip_and_bounds() -> None:
    from iac.errors import MessageRejected
    from iac.protocol.records import AgentRecord, decode_record, open_record, sign_record

    ident = Identity.generate()
    relay = Identity.generate().agent_id
    cands = (("observed", "quic://203.0.113.7:4433"), ("local", "quic://10.0.0.2:4433"), ("relay", relay))
    rec = AgentRecord(ident.agent_id, 1, 2**40, addresses=("quic://10.0.0.2:4433",), candidates=cands)
    signed = sign_record(ident, rec)
    assert open_record(signed.data, signed.signature, 0).candidates == cands
    assert b'"candidates":[{"kind":"observed","value":"quic://203.0.113.7:4433"}' in signed.data
    # without candidates the record reads byte for byte as before the field existed
    assert b"candidates" not in AgentRecord(ident.agent_id, 1, 2**40).encode()
    many = tuple(("local", f"quic://10.0.0.{i}:1") for i in range(1, 10))
    with pytest.raises(ConfigError, match="over the limit of 8"):
        AgentRecord(ident.agent_id, 1, 2**40, candidates=many)
    for bad in (("public", "quic://1.2.3.4:5"), ("relay", "quic://1.2.3.4:5"), ("local", "unix:///x")):
        with pytest.raises(ConfigError):
            AgentRecord(ident.agent_id, 1, 2**40, candidates=(bad,))
    raw = rec.encode().replace(b'"kind":"relay"', b'"kind":"relayx"')
    with pytest.raises(MessageRejected) as exc_info:
        decode_record(raw)
    assert exc_info.value.reason == "bad_record"


def test_check_candidates_refuses_more_than_the_cap() -> None:
    from iac.errors import HandlerError
    from iac.mesh.nat import check_candidates

    ok = [["observed", "quic://203.0.113.7:1"], ["relay", Identity.generate().agent_id]]
    assert check_candidates(ok) == [tuple(c) for c in ok]
    for bad in (
        [["local", f"quic://10.0.0.1:{i}"] for i in range(1, 10)],
        [["local", "tls://1.2.3.4:5"]],
        "x",
    ):
        with pytest.raises(HandlerError):
            check_candidates(bad)


def test_punch_datagrams_are_rate_limited_per_destination() -> None:
    async def main() -> None:
        from iac.mesh.nat import Traversal

        async with Node(listen=[LOOPBACK]) as node:
            sent: list[tuple[str, int]] = []

            class Listener:
                def punch(self, dest: tuple[str, int]) -> bool:
                    sent.append(dest)
                    return True

            t = Traversal(node, punch_burst=3, punch_rate=0.001, punch_spacing=0)
            targets = [("observed", "quic://203.0.113.7:4433"), ("local", "quic://203.0.113.8:4433")]
            await t._punch(Listener(), targets)
            await t._punch(Listener(), targets)  # the budget is spent: nothing more
            assert sent.count(("203.0.113.7", 4433)) == 3 and sent.count(("203.0.113.8", 4433)) == 3
            assert t.stats_.punch_rate_limited == 6 and t.stats_.punch_datagrams == 6
            await t.close()
            # all destinations together: at most 2 x punch_total_rate at once
            sent.clear()
            t = Traversal(node, punch_burst=4, punch_total_rate=1.0, punch_spacing=0)
            many = [("observed", f"quic://203.0.113.{i}:4433") for i in range(1, 9)]
            await t._punch(Listener(), many)
            assert len(sent) == 2 and t.stats_.punch_rate_limited == 4 * 8 - 2
            await t.close()

    run(main())


def test_published_record_carries_candidates_and_the_registry_reports_the_observed_address() -> None:
    async def main() -> None:
        from iac.mesh import MeshClient, Traversal, serve_registry

        async with (
            Node(listen=[LOOPBACK]) as reg,
            Node(listen=[LOOPBACK], config=NodeConfig(publish_private_addresses=False)) as lan_shy,
            Node(listen=[LOOPBACK]) as a,
        ):
            serve_registry(reg)
            trav = Traversal(a, relays=[reg.agent_id])
            client = MeshClient(a, reg.agent_id, reg.addresses, ttl=60)
            await client.start()
            # the registry's signed publish reply said where it sees a: its listen address
            assert trav.observed == {reg.agent_id: a.addresses[0]}
            await client.publish()
            assert client.record is not None
            assert client.record.candidates == (("observed", a.addresses[0]), ("relay", reg.agent_id))
            shy = MeshClient(lan_shy, reg.agent_id, reg.addresses, publish=False)
            [found] = await shy.lookup(agent_id=a.agent_id)
            assert found.candidates == client.record.candidates
            # a node that keeps LAN addresses to itself publishes none of its loopback ones
            assert shy.make_record().addresses == ()
            for closing in (client, trav, shy):
                await closing.close()

    run(main())


# --- through real NATs (network namespaces) ---------------------------------------------------


def _no_root() -> str | None:
    """Why the NAT lab cannot run here: only not Linux, or not root. As root nothing skips: a
    missing ``iptables`` or ``conntrack`` fails the test (``make test`` installs them)."""
    if not sys.platform.startswith("linux"):
        return f"needs Linux network namespaces (this is {sys.platform})"
    if os.geteuid() != 0:
        return "needs root (ip netns, iptables); run the suite as root to include it"
    return None


needs_lab = pytest.mark.skipif(_no_root() is not None, reason=f"NAT lab: {_no_root()}")


def _run_lab(body: Any, **lab_args: Any) -> None:

    with NatLab(tag=f"t{os.getpid() % 100000}", **lab_args) as lab:
        run(body(lab), timeout=90)


@needs_lab
def test_two_nats_connect_directly() -> None:
    async def body(lab: Any) -> None:
        async with NatScene(lab) as s:
            # Observed addresses: the relay sees each node at its NAT's WAN address and the port
            # its listener socket got there (the one socket).
            seen_a, seen_b = await s.observe()
            assert seen_a.startswith(f"quic://{lab.wan_a}:") and seen_b.startswith(f"quic://{lab.wan_b}:")
            assert ("observed", seen_a) in s.ta.candidates()
            # Before: through the relay.
            await s.requests(3, "relayed")
            before = s.relayed()
            assert before >= 6 and s.ta.path(s.b.agent_id) == "relayed"
            assert await s.ta.connect_direct(s.b.agent_id)
            conn = s.a.connection(s.b.agent_id)
            assert conn is not None and conn.peer.address == seen_b  # B's NAT mapping, directly
            assert s.ta.path(s.b.agent_id) == "direct"
            # The punch took three messages through the relay: PUNCH, its reply, PUNCH_SYNC.
            assert s.relayed() == before + 3
            # After: nothing more through the relay; the packets cross the public router instead.
            forwarded, at_relay = lab.forwarded(), lab.received_public()
            await s.requests(20, "direct")
            assert s.relayed() == before + 3
            assert lab.forwarded() >= forwarded + 40  # 20 requests and 20 replies at least
            assert lab.received_public() - at_relay < 10  # keep-alives at most
            st = s.ta.stats()
            assert (st["punch_attempts"], st["punch_successes"], st["punch_failures"]) == (1, 1, 0)
            assert st["paths"] == {s.b.agent_id: "direct"} and s.tb.stats()["punches_answered"] == 1
            # the answering side punched toward a's candidates but keeps them out of its peer book
            assert s.a.agent_id not in s.b.peer_book
            # the same in node stats and the status view
            ns = s.a.stats()
            assert ns.nat["punch_successes"] == 1 and ns.nat["direct"] == 1
            assert ns.peer_links[s.b.agent_id]["path"] == "direct"
            text = render({"agent_id": s.a.agent_id, "stats": dataclasses.asdict(ns)})
            assert "nat  punch_attempts 1  punch_successes 1  punch_failures 0" in text
            assert f"{s.b.agent_id[:16]}  quic      direct  quic://{lab.wan_b}:" in text
            assert f"candidate observed {seen_a}" in text
            assert len(s.handled) == len(set(s.handled)) == 23

    _run_lab(body)


@needs_lab
def test_symmetric_nat_falls_back_to_the_relay() -> None:
    async def body(lab: Any) -> None:
        async with NatScene(lab) as s:
            s.ta.direct_timeout = 4.0
            await s.observe()
            assert not await s.ta.connect_direct(s.b.agent_id)
            assert s.a.connection(s.b.agent_id) is None and s.ta.path(s.b.agent_id) == "relayed"
            before = s.relayed()
            await s.requests(10, "sym")
            assert s.relayed() == before + 20  # request and reply, each through the relay
            st = s.ta.stats()
            assert (st["punch_attempts"], st["punch_successes"], st["punch_failures"]) == (1, 0, 1)
            assert s.a.stats().peer_links[s.b.agent_id]["path"] == "relayed"
            assert len(s.handled) == len(set(s.handled)) == 10

    _run_lab(body, symmetric=True)


@needs_lab
def test_both_behind_one_nat_connect_over_the_lan() -> None:
    async def body(lab: Any) -> None:
        async with NatScene(lab) as s:
            await s.observe()
            assert await s.ta.connect_direct(s.b.agent_id)
            conn = s.a.connection(s.b.agent_id)
            # MASQUERADE does not hairpin: the LAN candidate is the one that works.
            assert conn is not None and conn.peer.address == s.b.addresses[0]
            before = s.relayed()
            await s.requests(5, "lan")
            assert s.relayed() == before

    _run_lab(body, shared=True)


@needs_lab
def test_switch_to_direct_loses_and_duplicates_nothing() -> None:
    """Acknowledged one-way messages sent all through the switch from relay to direct path:
    each is handled exactly once."""

    async def body(lab: Any) -> None:
        async with NatScene(lab) as s:
            await s.observe()
            got: list[str] = []
            s.b.on(MessageType.CREATE)(lambda ctx: got.append(str(ctx.payload)))
            stop = asyncio.Event()
            sent: list[Any] = []
            after_switch = 0

            async def pump() -> None:
                nonlocal after_switch
                while after_switch < 30:
                    sent.append(await s.a.send(s.b.agent_id, MessageType.CREATE, f"m{len(sent)}", ack=True))
                    after_switch += stop.is_set()
                    await asyncio.sleep(0.005)  # a steady trickle, not a synchronisation

            start = s.relayed()
            task = asyncio.create_task(pump())
            await eventually(lambda: len(sent) >= 5)
            assert await s.ta.connect_direct(s.b.agent_id)
            stop.set()
            switched = s.relayed()
            await task
            await asyncio.gather(*(m.wait() for m in sent))
            names = [f"m{i}" for i in range(len(sent))]
            await eventually(lambda: len(got) >= len(names))
            assert sorted(got) == sorted(names) and len(got) == len(set(got))
            # some went through the relay before the switch, the last 30 went direct
            assert switched - start > 3 + 5
            assert s.relayed() - switched < 10  # late ACKs of earlier ones; 30 relayed would be 60

    _run_lab(body)


@needs_lab
def test_nat_that_forgets_its_mappings_recovers() -> None:
    async def body(lab: Any) -> None:
        async with NatScene(lab) as s:
            await s.observe()
            s.ta.watch(s.b.agent_id)
            await eventually(lambda: s.a.connection(s.b.agent_id) is not None, timeout=20)
            await s.requests(3, "before")
            lab.flush_mappings(lab.nat_a)
            lab.flush_mappings(lab.nat_b)
            # Messages still arrive (on the direct path once its packets opened the NATs again,
            # or through the relay while it is down), each handled once.
            await s.requests(10, "after")
            await eventually(lambda: s.ta.path(s.b.agent_id) == "direct", timeout=30)
            await s.requests(3, "again")
            assert len(s.handled) == len(set(s.handled)) == 16

    _run_lab(body)


def test_no_punch_for_a_peer_the_policy_refuses_and_observed_addresses_are_never_dialed() -> None:
    async def main() -> None:
        from iac.mesh import Traversal
        from iac.protocol.routing import RelayPolicy

        relaying = NodeConfig(relay_policy=RelayPolicy(relay_unicast=True))
        async with (
            Node(listen=[LOOPBACK], config=relaying) as relay,
            Node(listen=[LOOPBACK]) as a,
            Node(listen=[LOOPBACK]) as b,
        ):
            for node, other in ((a, b), (b, a)):
                node.add_peer(relay.agent_id, *relay.addresses)
                node.add_route(other.agent_id, relay.agent_id)
                await node.connect(relay.agent_id)
            ta = Traversal(a, direct_timeout=2.0)
            tb = Traversal(b, allow=lambda peer: False)
            tr = Traversal(relay)
            seen = await ta.observe(relay.agent_id)
            # an observed address is a candidate to publish, never an address to dial
            assert ("observed", seen) in ta.candidates()
            assert all(seen not in urls for urls in a.peer_book.values())
            assert not await ta.connect_direct(b.agent_id)  # b refuses: policy_denied
            assert a.connection(b.agent_id) is None
            assert tb.stats_.refused == 1 and tb.stats_.punch_datagrams == 0
            assert ta.stats_.punch_failures == 1 and ta.stats_.punch_datagrams == 0
            assert b.agent_id not in a.peer_book  # b sent no candidates: nothing to dial
            for t in (ta, tb, tr):
                await t.close()

    run(main())


def test_iac_node_nat_prints_and_publishes_its_candidates(tmp_path: Path) -> None:
    """`iac node --nat --registry ...`: the registry's observed address is a candidate, printed
    at start, in the published record and in `iac status`."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "XDG_RUNTIME_DIR": str(tmp_path / "run")}
    (tmp_path / "run").mkdir(mode=0o700)
    iac_cmd = [sys.executable, "-m", "iac"]
    for name in ("reg", "n"):
        subprocess.run([*iac_cmd, "keygen", "--out", str(tmp_path / f"{name}.key")], check=True, env=env)
    procs: list[subprocess.Popen[str]] = []

    def start(*argv: str) -> subprocess.Popen[str]:
        p = subprocess.Popen([*iac_cmd, *argv], stdout=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
        procs.append(p)
        return p

    def line(p: subprocess.Popen[str]) -> list[str]:
        assert p.stdout is not None
        return p.stdout.readline().split()

    try:
        reg = start("registry", "--key", str(tmp_path / "reg.key"), "--listen", LOOPBACK, "--store", "memory")
        rid = line(reg)[1]
        line(reg)  # store
        rurl = line(reg)[1]
        admin = tmp_path / "run" / "n.sock"
        node = start("node", "--key", str(tmp_path / "n.key"), "--listen", LOOPBACK, "--registry",
                     f"{rid}@{rurl}", "--nat", "--admin", str(admin))  # fmt: skip
        line(node)  # node ID
        listening = line(node)
        assert listening[0] == "listening"
        addr = listening[1]
        # the registry, dialed from the node's one socket, sees it at its listen address
        assert line(node) == ["candidate", "observed", addr]
        assert line(node)[0] == "status"  # the local address is the observed one: listed once
        status = subprocess.run([*iac_cmd, "status", "--admin", str(admin)], capture_output=True, text=True,
                                env=env, timeout=60)  # fmt: skip
        assert status.returncode == 0, status.stderr
        assert "nat  punch_attempts 0" in status.stdout and f"candidate observed {addr}" in status.stdout
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=20)


@needs_lab
def test_two_nats_connect_directly_over_ipv6() -> None:
    """NAT66 (ip6tables MASQUERADE, unsolicited inbound dropped) on both sides: the same punch."""

    async def body(lab: Any) -> None:
        async with NatScene(lab, ipv6=True) as s:
            seen_a, seen_b = await s.observe()
            assert seen_a.startswith(f"quic://[{lab.wan6_a}]:") and seen_b.startswith(
                f"quic://[{lab.wan6_b}]:"
            )
            await s.requests(2, "relayed")
            before = s.relayed()
            assert await s.ta.connect_direct(s.b.agent_id)
            conn = s.a.connection(s.b.agent_id)
            assert conn is not None and conn.peer.address == seen_b
            await s.requests(10, "direct")
            assert s.relayed() == before + 3  # the punch's three messages, nothing more

    _run_lab(body, ipv6=True)


@needs_lab
def test_a_direct_path_that_dies_falls_back_to_the_relay_and_is_punched_again() -> None:
    async def body(lab: Any) -> None:
        quick = NodeConfig(transport=dataclasses.replace(NodeConfig().transport, keepalive_interval=0.3))
        async with NatScene(lab, config=quick, direct_timeout=2.0) as s:
            await s.observe()
            s.ta.watch(s.b.agent_id)
            await eventually(lambda: s.ta.path(s.b.agent_id) == "direct", timeout=20)
            await s.requests(3, "direct")
            lab.block_direct()  # the path between the NATs dies; the relay is still reachable
            await eventually(lambda: s.ta.path(s.b.agent_id) == "relayed", timeout=20)
            before = s.relayed()
            await s.requests(5, "relayed")
            assert s.relayed() >= before + 10  # through the relay now
            failures = s.ta.stats_.punch_failures
            await eventually(lambda: s.ta.stats_.punch_failures > failures, timeout=20)  # still trying
            lab.block_direct(False)
            await eventually(lambda: s.ta.path(s.b.agent_id) == "direct", timeout=30)  # punched again
            await s.requests(3, "again")
            assert len(s.handled) == len(set(s.handled)) == 11

    _run_lab(body)


@needs_lab
def test_one_nat_without_lan_candidates_falls_back_to_the_relay() -> None:
    """Both behind one NAT, LAN addresses kept private: only the NAT's WAN address is offered,
    MASQUERADE does not hairpin, so the punch fails and messages go through the relay."""

    async def body(lab: Any) -> None:
        shy = NodeConfig(publish_private_addresses=False)
        async with NatScene(lab, config=shy, direct_timeout=3.0) as s:
            await s.observe()
            assert [k for k, _ in s.tb.candidates()] == ["observed", "relay"]
            assert not await s.ta.connect_direct(s.b.agent_id)
            before = s.relayed()
            await s.requests(5, "hairpin")
            assert s.relayed() == before + 10 and s.ta.path(s.b.agent_id) == "relayed"

    _run_lab(body, shared=True)
