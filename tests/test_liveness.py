"""Liveness: results that say what happened and work that ends when its peer is gone.

A broadcast says how many peers it went to (0 is counted and logged), a registry counts the
broadcasts that missed agents it knows, a stream's handler ends once its consumer's connection is
gone (a consumer killed with SIGKILL, in its own process) and never runs past ``max_stream_time``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path

import pytest
from conftest import HERE, ROOT, run
from ports import free_port, free_udp_port

from iac import (
    MeshClient,
    Node,
    NodeConfig,
    PeerEvent,
    RelayPolicy,
    RemoteError,
    TransportConfig,
    serve_registry,
)
from iac.errors import CloseCode, ConnectionClosed, IacError
from iac.node import Broadcast
from iac.protocol.handshake import INSTANCE_CAPABILITY, instance_of
from iac.testing import eventually
from iac.transport.base import ConnectionTable, PeerInfo, Verdict
from iac.transport.core import SILENT_REASON, ConnectionCore, State, TimerEvent, silent_error
from iac.transport.session import SessionLogic
from iac.wire._pb.iac_pb2 import Hello
from iac.wire.identity import Identity

TLS = "tls://127.0.0.1:0"
CONSUMER = HERE / "stream_consumer.py"


def short_idle(idle: float) -> NodeConfig:
    return NodeConfig(transport=TransportConfig(idle_timeout=idle))


def test_a_broadcast_into_an_idle_mesh_reports_0(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        cfg = short_idle(0.4)
        async with Node(listen=[TLS], config=cfg) as a, Node(listen=[TLS], config=cfg) as b:
            got: list[object] = []
            b.on("BROADCAST")(lambda ctx: got.append(ctx.payload))
            down = asyncio.Event()
            a.on_peer(lambda ev: None if ev.up else down.set())
            a.add_peer(b.agent_id, *b.addresses)
            await a.connect(b.agent_id)
            sent = await a.broadcast("BROADCAST", "live")
            assert isinstance(sent, Broadcast) and sent.peers == 1 and int(sent) == 1
            await eventually(lambda: got == ["live"])
            assert a.stats().routing["unsent"] == 0
            await asyncio.wait_for(down.wait(), 5)  # the mesh idled out
            with caplog.at_level(logging.WARNING, logger="iac.node"):
                for _ in range(3):
                    idle = await a.broadcast("BROADCAST", "idle")
                    assert idle.peers == 0 and idle.peer == ""
            assert a.stats().routing["unsent"] == 3
            assert sum("reached no peer" in r.getMessage() for r in caplog.records) == 3
            assert got == ["live"]

    run(main())


def test_a_registry_counts_a_broadcast_that_missed_agents_it_knows(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with Node(listen=[TLS]) as rn, Node() as a, Node() as b, Node() as c:
            reg = serve_registry(rn)
            clients = [MeshClient(n, rn.agent_id, rn.addresses) for n in (a, b, c)]
            for mc in clients:
                await mc.start()
            await eventually(lambda: reg.stats()["live_agents"] == 3)
            got: list[str] = []
            for n in (b, c):
                n.on("BROADCAST")(lambda ctx, n=n: got.append(n.agent_id))
            sent = await a.broadcast("BROADCAST", 1)  # a -> registry -> b, c: everyone
            assert sent.peers == 1
            await eventually(lambda: len(got) == 2)
            assert reg.stats()["short_broadcasts"] == 0 and rn.stats().routing["short"] == 0
            conn = rn.connection(c.agent_id)  # c drops off the registry
            assert conn is not None
            await conn.close()
            await eventually(lambda: not rn.connected(c.agent_id))
            with caplog.at_level(logging.WARNING, logger="iac.mesh"):
                await a.broadcast("BROADCAST", 2)
                await eventually(lambda: len(got) == 3)
                await eventually(lambda: reg.stats()["short_broadcasts"] == 1)
            assert rn.stats().routing["short"] == 1
            assert any("reached 2 of the 3 agents" in r.getMessage() for r in caplog.records)
            for mc in clients:
                await mc.close()
            reg.close()

    run(main())


def test_a_stream_is_capped_by_max_stream_time() -> None:
    async def main() -> None:
        async with Node(listen=[TLS], config=NodeConfig(max_stream_time=0.3)) as server, Node() as client:
            client.add_peer(server.agent_id, *server.addresses)
            ended = asyncio.Event()

            @server.on("RUN")
            async def forever(ctx):  # type: ignore[no-untyped-def]
                try:
                    yield 0
                    await asyncio.Event().wait()
                finally:
                    ended.set()

            parts = []
            with pytest.raises(RemoteError) as err:
                async for part in client.stream(server.agent_id, "RUN", timeout=3600):
                    parts.append(part.payload)
            assert parts == [0] and err.value.code == "timeout"
            assert ended.is_set() and server.stats().running == 0
            with pytest.raises(Exception, match="max_stream_time"):
                NodeConfig(max_stream_time=0)

    run(main())


@pytest.mark.parametrize("transport", ["tls", "quic"])
def test_a_killed_consumer_frees_the_producers_slot(transport: str) -> None:
    async def main() -> None:
        async with Node(listen=[f"{transport}://127.0.0.1:0"]) as producer:
            started, ended = asyncio.Event(), asyncio.Event()
            down = asyncio.Event()

            @producer.on("RUN")
            async def forever(ctx):  # type: ignore[no-untyped-def]
                started.set()
                try:
                    i = 0
                    while True:
                        yield i
                        i += 1
                finally:
                    ended.set()

            def on_peer(ev: PeerEvent) -> None:
                if not ev.up:
                    down.set()

            producer.on_peer(on_peer)
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            proc = await asyncio.create_subprocess_exec(
                sys.executable, str(CONSUMER), producer.agent_id, producer.addresses[0],
                stdout=asyncio.subprocess.PIPE, env=env,
            )  # fmt: skip
            try:
                assert proc.stdout is not None
                line = await asyncio.wait_for(proc.stdout.readline(), 20)
                assert json.loads(line) == {"part": 0}
                await eventually(lambda: producer.stats().running == 1)  # waiting for credit
                assert not ended.is_set()
                loop = asyncio.get_running_loop()
                proc.send_signal(signal.SIGKILL)
                killed = loop.time()
                await asyncio.wait_for(ended.wait(), 10)
                await eventually(lambda: producer.stats().running == 0, timeout=10)
                assert loop.time() - killed < 10
                assert down.is_set()
                assert producer.stats().replies_sent <= 3  # the window of 2, and the part made
            finally:
                if proc.returncode is None:
                    proc.kill()
                await proc.wait()

    run(main())


class Peer:
    """A same_key_peer.py process."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, key: str, server: Node) -> Peer:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(SAME_KEY), key, server.agent_id, server.addresses[0],
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=env,
        )  # fmt: skip
        peer = cls(proc)
        assert await peer.line() == {"ready": True}
        return peer

    async def line(self) -> dict[str, object]:
        assert self.proc.stdout is not None
        out = await asyncio.wait_for(self.proc.stdout.readline(), 20)
        assert out, "the peer process ended"
        return json.loads(out)  # type: ignore[no-any-return]

    async def ask(self, cmd: str) -> dict[str, object]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd.encode() + b"\n")
        await self.proc.stdin.drain()
        return await self.line()

    async def stop(self) -> bytes:
        if self.proc.returncode is None:
            self.proc.kill()
        assert self.proc.stderr is not None
        err = await self.proc.stderr.read()
        await self.proc.wait()
        return err


SAME_KEY = HERE / "same_key_peer.py"


async def serving(transport: str) -> tuple[Node, list[int]]:
    server = Node(listen=[f"{transport}://127.0.0.1:0"])
    await server.start()
    served: list[int] = []

    @server.on("RUN")
    async def run_(ctx):  # type: ignore[no-untyped-def]
        served.append(1)
        return {"served": len(served)}

    return server, served


@pytest.mark.parametrize("transport", ["quic", "tls"])
def test_a_crashed_and_restarted_peer_is_served_within_5_s(transport: str, tmp_path: Path) -> None:
    async def main() -> None:
        key = str(tmp_path / "agent.key")
        Identity.generate().save(key)
        server, _ = await serving(transport)
        first = second = None
        try:
            first = await Peer.start(key, server)
            assert (await first.ask("req"))["ok"] == {"served": 1}
            loop = asyncio.get_running_loop()
            first.proc.send_signal(signal.SIGKILL)
            await first.proc.wait()
            killed = loop.time()
            second = await Peer.start(key, server)  # dials while the server may hold the dead one
            got = await second.ask("req")
            assert got.get("ok") == {"served": 2}, got
            took = loop.time() - killed
            print(f"served {took:.2f} s after the kill")
            assert took < 5
            await eventually(lambda: len(server.stats().peer_links) >= 1)
            assert server.connection(Identity.load(key).agent_id) is not None
        finally:
            for p in (first, second):
                if p is not None:
                    await p.stop()
            await server.close()

    run(main())


@pytest.mark.parametrize("transport", ["quic", "tls"])
def test_two_live_processes_with_one_key_are_told_so(
    transport: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        key = str(tmp_path / "agent.key")
        Identity.generate().save(key)
        server, _ = await serving(transport)
        first = second = None
        try:
            with caplog.at_level(logging.WARNING, logger="iac.node"):
                first = await Peer.start(key, server)
                assert "ok" in await first.ask("req")
                second = await Peer.start(key, server)
                got = await second.ask("wait")
                assert got["closed"] == int(CloseCode.DUPLICATE_IDENTITY), got
                got = await first.ask("req")  # the first keeps its connection
                assert "ok" in got, got
            twins = [r for r in caplog.records if "two live processes hold the key" in r.getMessage()]
            assert len(twins) == 1
            assert first is not None and second is not None
            err1, err2 = await first.stop(), await second.stop()
            assert err2.decode().count("two live processes hold the key") == 1, err2
            assert b"two live processes" not in err1
        finally:
            for p in (first, second):
                if p is not None:
                    await p.stop()
            await server.close()

    run(main())


# --- the core's probes and the duplicate rule, without sockets ------------------------------------


def probing_core(keepalive: float | None = 10.0) -> ConnectionCore:
    c = ConnectionCore(
        now=0.0, idle_timeout=30.0, linger=1.0, keepalive=keepalive, probe_interval=1.0, probe_timeout=1.5
    )
    c.open(SessionLogic("a" * 64))
    c.start_keepalive(0.0)
    return c


def test_an_unanswered_probe_closes_the_core_within_its_bound() -> None:
    c = probing_core()
    assert c.probe(1.0, 1.5) and c.probing and c.state is State.OPEN
    assert not c.probe(1.2, 5.0)  # one probe at a time; a longer bound does not move it
    assert c.next_timer() == 2.5
    assert c.handle_timer(2.4) is TimerEvent.NONE and not c.closed
    assert c.handle_timer(2.5) is TimerEvent.DEAD
    assert c.closed and isinstance(c.error, ConnectionClosed)
    assert c.error.code == CloseCode.IDLE_TIMEOUT and c.error.peer_reason == SILENT_REASON
    assert c.error.args[0] == silent_error(1.5).args[0]
    assert not c.probe(3.0, 1.0)  # a closing connection is not probed


def test_an_answered_probe_leaves_the_core_open_and_only_an_open_one_is_probed() -> None:
    c = probing_core()
    assert c.probe(1.0, 1.5)
    c.heard(1.1)
    assert not c.probing and c.last_heard == 1.1
    assert c.next_timer() == 10.0  # the keep-alive again
    assert c.handle_timer(2.5) is TimerEvent.NONE and not c.closed
    assert c.probe(3.0, 1.0) and not c.probe(3.1, 0.5) and c.next_timer() == 3.6  # brought forward
    fresh = ConnectionCore(now=0.0, idle_timeout=30.0, linger=1.0, keepalive=10.0)
    assert not fresh.probe(0.0, 1.0)  # still HANDSHAKING
    assert not probing_core(keepalive=None).probe(0.0, 1.0)  # the kernel probes TLS/TCP


def test_a_peer_something_waits_on_is_probed_while_quiet_and_closed_when_silent() -> None:
    c = probing_core()
    assert c.next_timer() == 10.0  # nothing waits: only the keep-alive
    c.waiting = True
    assert c.next_timer() == 1.0  # last heard at 0, probe_interval 1 s
    c.last_heard = 0.8  # its data arrived: still alive
    assert c.handle_timer(1.0) is TimerEvent.NONE and c.next_timer() == 1.8
    assert c.handle_timer(1.8) is TimerEvent.PING and c.probing
    assert c.next_timer() == 3.3  # probe_timeout 1.5 s
    c.last_heard = 2.0  # data from the peer answers the probe too (counted at its deadline)
    assert c.handle_timer(3.3) is TimerEvent.PING and not c.closed  # quiet since 2.0: a new probe
    assert c.next_timer() == 4.8
    assert c.handle_timer(4.7) is TimerEvent.NONE and not c.closed
    assert c.handle_timer(4.8) is TimerEvent.DEAD  # nothing came: dead 2.8 s after it went quiet
    assert c.closed and c.error is not None and "unanswered for 1.5 s" in str(c.error)
    idle = probing_core(keepalive=None)  # a TLS/TCP core never probes: the kernel does
    idle.waiting = True
    assert idle.next_timer() == 30.0 and idle.handle_timer(5.0) is TimerEvent.NONE


class FakeConn:
    def __init__(self, peer: str, dialed: bool, instance: str = "") -> None:
        caps = [f"{INSTANCE_CAPABILITY}/{instance}"] if instance else []
        self.peer = PeerInfo(peer, "quic", "quic://x:1", Hello(capabilities=caps), dialed=dialed)
        self.closed = False


def test_the_duplicate_rule_decides_by_proof_of_process_then_by_the_tie_break() -> None:
    lo, hi = sorted(Identity.generate().agent_id for _ in range(2))
    table = ConnectionTable(lo)

    def verdict(old: FakeConn, new: FakeConn) -> Verdict:
        return table.verdict(old, new)  # type: ignore[arg-type]

    # another process proved the key: probe the old connection, whoever dialed
    assert verdict(FakeConn(hi, False, "p1"), FakeConn(hi, False, "p2")) is Verdict.PROBE
    assert verdict(FakeConn(hi, True, "p1"), FakeConn(hi, False, "p2")) is Verdict.PROBE
    # the same process dialed again: it gave up on the old one
    assert verdict(FakeConn(hi, False, "p1"), FakeConn(hi, False, "p1")) is Verdict.NEW
    # a peer that names no process and dials again: probe before replacing
    assert verdict(FakeConn(hi, False), FakeConn(hi, False)) is Verdict.PROBE
    # two live dials of one process: the one the lower AgentId dialed (this side) stays
    assert verdict(FakeConn(hi, False, "p1"), FakeConn(hi, True, "p1")) is Verdict.NEW
    assert verdict(FakeConn(hi, True, "p1"), FakeConn(hi, False, "p1")) is Verdict.OLD
    assert verdict(FakeConn(hi, True), FakeConn(hi, False)) is Verdict.OLD
    old, new = FakeConn(hi, False, "p1"), FakeConn(hi, False, "p1")
    assert table.add(old) == (old, None)  # type: ignore[arg-type]
    assert table.add(new) == (new, old)  # type: ignore[arg-type]
    assert table.get(hi) is new
    assert instance_of(Hello(capabilities=["x/1", f"{INSTANCE_CAPABILITY}/ab12"])) == "ab12"
    assert instance_of(Hello(capabilities=["x/1"])) == ""


# --- reachability: kept connections and a registry restart ----------------------------------------


async def start_registry_cli(
    key: str, port: int, transport: str = "tls"
) -> tuple[asyncio.subprocess.Process, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "iac", "registry", "--key", key, "--listen", f"{transport}://127.0.0.1:{port}",
        "--store", "memory", "--no-admin", stdout=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    lines = [(await asyncio.wait_for(proc.stdout.readline(), 20)).decode().split() for _ in range(3)]
    assert lines[0][0] == "registry" and lines[2][0] == "listening", lines
    return proc, lines[0][1]


@pytest.mark.parametrize("transport", ["tls", "quic"])
def test_agents_publish_again_within_5_s_of_a_registry_restart(transport: str, tmp_path: Path) -> None:
    """`iac registry --store memory` killed with SIGKILL and started again: its agents publish
    again within 5 s of it listening. On TLS the kernel resets the agents' connections at the kill;
    on QUIC nothing tells them, so the registry is started again at once and the agent's next probe
    of its kept connection (every 2 s) draws the restarted registry's stateless reset."""

    async def main() -> None:
        key = str(tmp_path / "registry.key")
        Identity.generate().save(key)
        port = free_port() if transport == "tls" else free_udp_port()
        reg, rid = await start_registry_cli(key, port, transport)
        url = f"{transport}://127.0.0.1:{port}"
        try:
            async with (
                Node(listen=[f"{transport}://127.0.0.1:0"]) as agent,
                Node() as asker,
                MeshClient(agent, rid, [url]) as mc,
                MeshClient(asker, rid, [url], publish=False) as ma,
            ):
                assert [e.agent_id for e in await ma.lookup(agent_id=agent.agent_id)] == [agent.agent_id]
                assert mc.published == 1
                reg.send_signal(signal.SIGKILL)  # its memory store goes with it
                await reg.wait()
                if transport == "tls":
                    await eventually(lambda: not agent.connected(rid))
                reg, _ = await start_registry_cli(key, port, transport)
                loop = asyncio.get_running_loop()
                back = loop.time()

                async def found() -> bool:
                    # asked by a node that never met the old process: a session ticket of the old
                    # one makes a QUIC dial's 0-RTT HELLO bound to the old certificate, refused once
                    try:
                        async with Node() as fresh, MeshClient(fresh, rid, [url], publish=False) as mf:
                            return bool(await mf.lookup(agent_id=agent.agent_id))
                    except IacError:
                        return False

                while not await found():
                    assert loop.time() - back < 5, "the agent did not publish again within 5 s"
                    await asyncio.sleep(0.1)
                took = loop.time() - back
                print(f"found again {took:.2f} s after the registry listened")
                assert mc.published == 2 and took < 5
        finally:
            if reg.returncode is None:
                reg.kill()
            await reg.wait()

    run(main())


def test_a_kept_connection_lives_past_the_idle_timeout_and_an_unkept_one_does_not() -> None:
    async def main() -> None:
        # the node checks keep-alives once a second: 1 s apart here, well within the 2.5 s idle
        idle = NodeConfig(transport=TransportConfig(idle_timeout=2.5), keepalive_messages=0.5)
        async with Node(listen=[TLS], config=idle) as relay, Node(config=idle) as a, Node(config=idle) as b:
            for n in (a, b):
                n.add_peer(relay.agent_id, *relay.addresses)
            a.keep_connected(relay.agent_id)
            await b.connect(relay.agent_id)
            await eventually(lambda: a.connected(relay.agent_id))
            first = a.connection(relay.agent_id)
            await eventually(lambda: not b.connected(relay.agent_id), timeout=5)  # idled out
            assert a.connection(relay.agent_id) is first  # the keep-alives count at both ends
            assert relay.stats().handled >= 2  # the keep-alive PINGs
            # dropped: dialed again at once
            relay_side = relay.connection(a.agent_id)
            assert relay_side is not None
            await relay_side.close()
            await eventually(
                lambda: a.connected(relay.agent_id) and a.connection(relay.agent_id) is not first
            )
            a.stop_keeping(relay.agent_id)
            await eventually(lambda: not a.connected(relay.agent_id), timeout=5)

    run(main())


def test_a_quic_send_file_survives_a_receiver_restart_with_cli_defaults(tmp_path: Path) -> None:
    """`iac node --inbox` killed with SIGKILL mid-transfer and started again on its port: `iac
    send-file` (defaults: 30 s without progress) finds the old connection dead by its probes,
    redials, resumes, and the file's hash is right."""

    async def main() -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        rkey, skey, inbox = tmp_path / "r.key", tmp_path / "s.key", tmp_path / "inbox"
        Identity.generate().save(rkey)
        Identity.generate().save(skey)
        data = os.urandom(12 * 1024 * 1024)
        src = tmp_path / "data.bin"
        src.write_bytes(data)
        url = f"quic://127.0.0.1:{free_udp_port()}"

        async def receiver() -> asyncio.subprocess.Process:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "iac", "node", "--key", str(rkey), "--listen", url,
                "--inbox", str(inbox), "--no-admin", stdout=asyncio.subprocess.PIPE, env=env,
            )  # fmt: skip
            assert proc.stdout is not None
            for _ in range(3):  # node ID / listening URL / inbox DIR
                await asyncio.wait_for(proc.stdout.readline(), 20)
            return proc

        rx = await receiver()
        rid = Identity.load(rkey).agent_id
        sender = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "iac", "send-file", "--key", str(skey), "--to", rid, "--addr", url,
            "--quiet", str(src), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
        )  # fmt: skip
        try:
            await eventually(lambda: any(p.suffix == ".json" for p in inbox.glob(".iac-part-*")), timeout=20)
            rx.send_signal(signal.SIGKILL)  # mid-transfer: its state file is on disk
            await rx.wait()
            rx = await receiver()
            out, err = await asyncio.wait_for(sender.communicate(), 60)
            assert sender.returncode == 0, err.decode()
            assert (inbox / "data.bin").read_bytes() == data
            assert b"reconnect" in out and b" 0 reconnects" not in out, out
        finally:
            for p in (rx, sender):
                if p.returncode is None:
                    p.kill()
                await p.wait()

    run(main(), timeout=90)


def test_send_request_and_call_go_through_a_relay_with_via(tmp_path: Path) -> None:
    async def main() -> None:
        relay_cfg = NodeConfig(relay_policy=RelayPolicy(relay_unicast=True))
        key = tmp_path / "cli.key"
        cli = Identity.generate()
        cli.save(key)
        async with Node(listen=[TLS], config=relay_cfg) as relay, Node() as target:  # target: no listener
            got: list[object] = []

            @target.on("RUN")
            async def echo(ctx):  # type: ignore[no-untyped-def]
                got.append(ctx.payload)
                return {"echo": ctx.payload, "via": ctx.via}

            target.expose(lambda a, b: a + b, name="add")
            target.add_peer(relay.agent_id, *relay.addresses)
            target.keep_connected(relay.agent_id)
            await eventually(lambda: relay.connected(target.agent_id))
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            common = ["--key", str(key), "--to", target.agent_id, "--via", relay.agent_id,
                      "--addr", relay.addresses[0], "--timeout", "10"]  # fmt: skip

            async def iac(*argv: str) -> str:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "iac", *argv, stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE, env=env,
                )  # fmt: skip
                out, err = await asyncio.wait_for(proc.communicate(), 30)
                assert proc.returncode == 0, err.decode()
                return out.decode()

            out = await iac("request", *common, "--payload", '{"x": 1}')
            assert json.loads(out) == {"echo": {"x": 1}, "via": relay.agent_id}
            assert json.loads(await iac("call", *common, "add", "2", "3")) == 5
            assert (await iac("send", *common, "--payload", '"one-way"', "--ack")).split()[0] == "sent"
            assert got == [{"x": 1}, "one-way"]
            assert relay.stats().routing["relayed"] >= 6  # each message and its answer
            assert not target.connected(cli.agent_id)

    run(main())


def test_one_origin_cannot_take_the_relay_from_another() -> None:
    async def main() -> None:
        policy = RelayPolicy(relay_unicast=True, origin_rate=0.01, origin_burst=2, origin_bytes=1e6)
        async with (
            Node(listen=[TLS], config=NodeConfig(relay_policy=policy)) as relay,
            Node() as target,
            Node() as a,
            Node() as b,
        ):
            got: list[str] = []
            target.on("RUN")(lambda ctx: got.append(ctx.sender))
            for n in (target, a, b):
                n.add_peer(relay.agent_id, *relay.addresses)
                await n.connect(relay.agent_id)
            for _ in range(5):
                await a.send(target.agent_id, "RUN", via=relay.agent_id)
            await b.send(target.agent_id, "RUN", via=relay.agent_id)
            await eventually(lambda: got.count(b.agent_id) == 1)
            await eventually(lambda: relay.stats().route_refused.get("relay_rate") == 3)
            assert got.count(a.agent_id) == 2  # its burst; the other three refused, b untouched

    run(main())


def test_iac_registry_relay_serves_agents_with_a_live_record(tmp_path: Path) -> None:
    async def main() -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        rkey, ckey = str(tmp_path / "registry.key"), str(tmp_path / "cli.key")
        Identity.generate().save(rkey)
        Identity.generate().save(ckey)
        port = free_port()
        reg = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "iac", "registry", "--key", rkey, "--listen", f"tls://127.0.0.1:{port}",
            "--store", "memory", "--no-admin", "--relay", stdout=asyncio.subprocess.PIPE, env=env,
        )  # fmt: skip
        try:
            assert reg.stdout is not None
            rid = (await asyncio.wait_for(reg.stdout.readline(), 20)).decode().split()[1]
            for _ in range(2):
                await asyncio.wait_for(reg.stdout.readline(), 20)
            url = f"tls://127.0.0.1:{port}"

            async def request(to: str) -> tuple[int, str]:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "iac", "request", "--key", ckey, "--to", to, "--via", rid,
                    "--addr", url, "--timeout", "3", stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE, env=env,
                )  # fmt: skip
                out, err = await asyncio.wait_for(proc.communicate(), 30)
                return int(proc.returncode or 0), (out + err).decode()

            async with Node() as agent, Node() as stranger:  # no listener: reachable only by relay
                agent.on("RUN")(lambda ctx: {"hi": ctx.sender})
                stranger.on("RUN")(lambda ctx: {"hi": ctx.sender})
                stranger.add_peer(rid, url)
                await stranger.connect(rid)  # connected, but no record in the registry
                async with MeshClient(agent, rid, [url], addresses=[]):
                    rc, out = await request(agent.agent_id)
                    assert rc == 0 and json.loads(out) == {"hi": Identity.load(ckey).agent_id}, out
                    rc, out = await request(stranger.agent_id)
                    assert rc != 0 and "no answer" in out, out  # not relayed: neither end has a record
        finally:
            if reg.returncode is None:
                reg.kill()
            await reg.wait()

    run(main(), timeout=60)
