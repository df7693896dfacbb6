"""Chaos: processes killed with SIGKILL, a replay store that goes away or cannot write, a clock that
jumps, a network partition. Each test states the outcome that must hold and checks it.

Nodes whose death matters run as real processes (tests/chaos_agent.py) and are killed with SIGKILL
at a point the test picks from what they reported; a restarted process keeps its identity (the
same seed), its listening address and its replay store. What a handler did is counted in a file
the handling process appends to, one ``write`` per message, so the count survives the kill.

Tests marked ``xfail(strict=True)`` state an outcome the library does not reach yet; each reason
names the cause. docs/THREAT_MODEL.md ("Chaos") lists every scenario with the figures of a run
(``pytest -s tests/test_chaos.py`` prints them as ``[chaos]`` lines).

Short runs by default (a few seconds each); ``IAC_SLOW=1`` runs the bigger variants (more
messages, the full 10 s partition).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import run
from redis_server import RedisServer, free_port
from test_pipeline import RawPeer

from iac import Context, MessageType, Node, NodeConfig, RemoteError, Sent
from iac.errors import StoreUnavailable
from iac.protocol.clock import OffsetClock
from iac.protocol.replay import DEFAULT_RESERVATION_LEASE_US, ReplayConfig, ReplayStore
from iac.stores import MemoryReplayStore, RedisReplayStore, SqliteReplayStore
from iac.testing import eventually
from iac.wire.message import encode_message_frame

SLOW = os.environ.get("IAC_SLOW") == "1"
HERE = Path(__file__).resolve().parent
AGENT = HERE / "chaos_agent.py"
ROOT = HERE.parent

#: Fast retransmission for every node of these tests: a restart or a partition is bridged by
#: retransmissions well inside the delivery deadline.
FAST: dict[str, Any] = {"retransmit_initial": 0.1, "retransmit_max": 0.5, "drain_timeout": 0.5}
STORES = ["sqlite", "redis"]


def report(text: str) -> None:
    """A figure for docs/THREAT_MODEL.md ("Chaos"); shown with ``pytest -s``."""
    print(f"\n[chaos] {text}")


# --- a node process -------------------------------------------------------------------------------


class Agent:
    """A ``tests/chaos_agent.py`` process: the lines it printed, commands, SIGKILL."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[dict[str, Any]] = []
        self._new = asyncio.Event()
        self._reader = asyncio.ensure_future(self._read())
        self.hello: dict[str, Any] = {}

    @classmethod
    async def start(cls, settings: dict[str, Any], prefix: list[str] | None = None) -> Agent:
        proc = await asyncio.create_subprocess_exec(
            *(prefix or []), sys.executable, str(AGENT), json.dumps(settings),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        agent = cls(proc)
        agent.hello = await agent.expect("id", 30)
        return agent

    @property
    def agent_id(self) -> str:
        return str(self.hello["id"])

    @property
    def addrs(self) -> list[str]:
        return list(self.hello["addrs"])

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            self.lines.append(json.loads(line))
            self._new.set()
        self._new.set()

    async def expect(self, key: str, timeout: float) -> dict[str, Any]:
        """The first line printed (and not taken yet) that has ``key``."""
        async with asyncio.timeout(timeout):
            while True:
                for n, line in enumerate(self.lines):
                    if key in line:
                        return self.lines.pop(n)
                if self._reader.done():
                    raise AssertionError(f"agent exited ({self.proc.returncode}) before printing {key!r}")
                self._new.clear()
                await self._new.wait()

    async def tell(self, cmd: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        await self.proc.stdin.drain()

    async def ask(self, cmd: dict[str, Any], key: str, timeout: float = 30) -> dict[str, Any]:
        await self.tell(cmd)
        return await self.expect(key, timeout)

    async def stats(self) -> dict[str, Any]:
        return (await self.ask({"cmd": "stats"}, "stats"))["stats"]

    def kill_now(self) -> None:
        """SIGKILL: no drain, no GOAWAY, nothing it reserved is released."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)

    async def kill(self) -> None:
        self.kill_now()
        assert await self.proc.wait() == -signal.SIGKILL
        await self._reader

    async def quit(self) -> None:
        if self.proc.returncode is None:
            await self.tell({"cmd": "quit"})
            await asyncio.wait_for(self.proc.wait(), 20)
        await self._reader

    async def stop(self) -> None:
        """Whatever state it is in (for ``finally``)."""
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        self._reader.cancel()


@contextlib.asynccontextmanager
async def agents() -> AsyncIterator[list[Agent]]:
    """Every agent a test started is stopped at its end, whatever happened."""
    started: list[Agent] = []
    try:
        yield started
    finally:
        for a in started:
            await a.stop()


async def start_agent(procs: list[Agent], settings: dict[str, Any], prefix: list[str] | None = None) -> Agent:
    agent = await Agent.start(settings, prefix)
    procs.append(agent)
    return agent


# --- what handlers did ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Handled:
    i: int
    session: str
    msg_id: int
    pid: int


def read_log(path: Path) -> list[Handled]:
    """The lines a chaos agent appended (one ``write`` each: SIGKILL cannot cut one in half)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        i, session, msg_id, pid = line.split()
        out.append(Handled(int(i), session, int(msg_id), int(pid)))
    return out


@dataclass
class Ledger:
    """Handled messages, and the checks of effectively-once in order."""

    rows: list[Handled] = field(default_factory=list)

    def by_session(self) -> dict[str, list[Handled]]:
        out: dict[str, list[Handled]] = defaultdict(list)
        for h in self.rows:
            out[h.session].append(h)
        return out

    def check_once_in_order(self) -> None:
        """No ``(session, msg_id)`` handled twice; each session handled in increasing id order."""
        twice = [k for k, n in Counter((h.session, h.msg_id) for h in self.rows).items() if n > 1]
        assert not twice, f"handled twice: {twice[:5]}"
        for session, rows in self.by_session().items():
            ids = [h.msg_id for h in rows]
            assert ids == sorted(ids), f"session {session}: out of order {ids[:20]}"

    def count(self, i: int) -> int:
        return sum(1 for h in self.rows if h.i == i)


def recorder(node: Node, rows: list[Handled]) -> None:
    """An in-process RUN handler that records like the agent's."""

    @node.on(MessageType.RUN)
    def on_run(ctx: Context) -> None:
        m = ctx.message
        rows.append(Handled(ctx.payload["i"], f"{m.session_id:016x}", m.msg_id, os.getpid()))


async def send_run(node: Node, peer: str, items: range | list[int], *, ordered: bool = True) -> list[Sent]:
    return [await node.send(peer, MessageType.RUN, {"i": i}, ack=True, ordered=ordered) for i in items]


async def outcomes(sent: list[Sent]) -> list[BaseException | None]:
    return await asyncio.gather(*(s.wait() for s in sent), return_exceptions=True)


# --- stores ---------------------------------------------------------------------------------------


def seed_hex() -> str:
    return os.urandom(32).hex()


def replay_config(config: NodeConfig) -> ReplayConfig:
    return ReplayConfig(config.replay_window, config.transport.max_skew_us, config.max_sessions)


def store_spec(kind: str, tmp: Path, redis_url: str | None) -> dict[str, Any]:
    """The replay store of an agent process (a restart opens the same one)."""
    if kind == "sqlite":
        return {"kind": "sqlite", "path": str(tmp / "replay.sqlite")}
    return {"kind": "redis", "url": redis_url, "prefix": f"iac:chaos:{uuid.uuid4().hex}"}


@pytest.fixture
def store_url(request: pytest.FixtureRequest) -> str | None:
    """The Redis URL for the ``redis`` parameter (the session's server), None for SQLite."""
    kind = request.node.callspec.params["kind"]
    return str(request.getfixturevalue("redis_url")) if kind == "redis" else None


def receiver_settings(tmp: Path, spec: dict[str, Any], **config: Any) -> dict[str, Any]:
    """A receiver agent on a fixed port (so that a restart listens where its peers dial)."""
    return {
        "seed": seed_hex(),
        "listen": [f"tls://127.0.0.1:{free_port()}"],
        "store": spec,
        "log": str(tmp / "handled.log"),
        "config": {**FAST, **config},
    }


# --- 1. the sender killed mid-stream --------------------------------------------------------------

N_SENDER = 3000 if SLOW else 300


@pytest.mark.slow  # 300 messages by default; IAC_SLOW=1 sends 3000
@pytest.mark.parametrize("kind", STORES)
def test_chaos_sender_killed_mid_ordered_stream(kind: str, store_url: str | None, tmp_path: Path) -> None:
    """SIGKILL of the sender of an ACK_REQUESTED + ORDERED stream. Started again with the same
    identity, it sends (in a new session) what it never saw acknowledged. The receiver handled
    every message the dead sender got an ACK for exactly once, each session in order, and goes
    on serving."""

    async def main() -> None:
        cfg = NodeConfig(sync_in_thread=False, **FAST)
        if kind == "sqlite":  # NORMAL: this receiver is never killed; only the speed differs
            store: ReplayStore = SqliteReplayStore(
                tmp_path / "r.sqlite", replay_config(cfg), synchronous="NORMAL"
            )
        else:
            assert store_url is not None
            store = RedisReplayStore(
                store_url, replay_config(cfg), key_prefix=f"iac:chaos:{uuid.uuid4().hex}"
            )
        rows: list[Handled] = []
        async with Node(listen="tls://127.0.0.1:0", config=cfg, replay_store=store) as rx, agents() as procs:
            recorder(rx, rows)
            acks = tmp_path / "acks.log"
            settings = {
                "seed": seed_hex(),
                "acks": str(acks),
                "config": FAST,
                "peers": {rx.agent_id: rx.addresses},
            }
            tx = await start_agent(procs, settings)
            await tx.tell({"cmd": "send", "to": rx.agent_id, "items": list(range(N_SENDER))})
            await eventually(lambda: len(read_log(acks)) >= N_SENDER // 3, timeout=30, interval=0.002)
            await tx.kill()
            t_kill = time.monotonic()
            acked_dead = {a.i for a in read_log(acks)}
            assert N_SENDER // 3 <= len(acked_dead) < N_SENDER, "killed mid-stream"
            dead_sessions = {a.session for a in read_log(acks)}
            assert len(dead_sessions) == 1

            # what reached the receiver before the kill is handled, and nothing of it waits
            await eventually(lambda: rx.stats().reorder_held == 0 and rx.stats().ordered_queued == 0)
            handled_dead = [h for h in rows if h.session in dead_sessions]
            assert {h.i for h in handled_dead} >= acked_dead

            tx2 = await start_agent(procs, settings)
            assert tx2.agent_id == tx.agent_id
            rest = [i for i in range(N_SENDER) if i not in acked_dead]
            await tx2.tell({"cmd": "send", "to": rx.agent_id, "items": rest})
            settled = (await tx2.expect("settled", 60))["settled"]
            recovered = time.monotonic() - t_kill
            assert settled["failed"] == {} and sorted(settled["acked"]) == rest

            ledger = Ledger(rows)
            ledger.check_once_in_order()
            new_sessions = {a.session for a in read_log(acks)} - dead_sessions
            assert len(new_sessions) == 1, "the restarted sender sends in a new session"
            for i in acked_dead:  # acknowledged before the kill: handled exactly once, never again
                assert ledger.count(i) == 1, i
            for i in rest:  # the rest: once in the new session (and at most once before the kill)
                assert sum(1 for h in rows if h.i == i and h.session in new_sessions) == 1
            # the dead sender's session was handled in order up to where it was cut, without a gap
            assert [h.msg_id for h in handled_dead] == list(range(1, len(handled_dead) + 1))

            # the receiver goes on serving, with nothing of the dead sender left running or held
            async with Node(config=cfg) as other:
                other.add_peer(rx.agent_id, *rx.addresses)
                assert (await other.request(rx.agent_id, MessageType.PING, timeout=5)).payload is None
            st = rx.stats()
            assert st.running == 0 and st.backlog == 0 and st.reorder_held == 0 and st.gaps == 0
            report(
                f"sender SIGKILL ({kind}): {N_SENDER} messages; {len(acked_dead)} acknowledged before "
                f"the kill, {len(handled_dead) - len(acked_dead)} more handled without the sender "
                f"seeing the ACK; {len(rest)} sent again by the restarted sender, all acknowledged "
                f"{recovered:.2f} s after the kill; receiver refused {dict(st.refused)}"
            )
            await tx2.quit()

    run(main(), timeout=120)


# --- 2. the receiver killed mid-stream and mid-transfer -------------------------------------------

N_RECEIVER = 1000 if SLOW else 300


@pytest.mark.slow  # 300 messages by default; IAC_SLOW=1 sends 1000
@pytest.mark.parametrize("kind", STORES)
def test_chaos_receiver_killed_mid_ordered_stream(kind: str, store_url: str | None, tmp_path: Path) -> None:
    """SIGKILL of the receiver of an ACK_REQUESTED + ORDERED stream; it starts again with the same
    identity, address and replay store while the sender retransmits. Every message the sender saw
    acknowledged was handled exactly once; nothing is handled twice; every send ends (ACK or
    DeliveryError, none hangs); the restarted receiver serves."""

    async def main() -> None:
        timeout = 3.0
        cfg = NodeConfig(sync_in_thread=False, delivery_timeout=timeout, **FAST)
        settings = receiver_settings(
            tmp_path, store_spec(kind, tmp_path, store_url), delivery_timeout=timeout
        )
        log = Path(settings["log"])
        async with agents() as procs, Node(config=cfg) as tx:
            rx = await start_agent(procs, settings)
            tx.add_peer(rx.agent_id, *rx.addrs)
            sent: list[Sent] = []

            async def stream() -> None:
                for i in range(N_RECEIVER):
                    sent.append(await tx.send(rx.agent_id, MessageType.RUN, {"i": i}, ack=True, ordered=True))

            streaming = asyncio.ensure_future(stream())
            await eventually(lambda: len(read_log(log)) >= N_RECEIVER // 3, timeout=30, interval=0.002)
            await rx.kill()
            t_kill = time.monotonic()
            handled_at_kill = len(read_log(log))
            acked_at_kill = sum(s.acked for s in sent)
            in_flight = len(sent) - acked_at_kill
            assert in_flight > 0, "killed with messages in flight"
            rx2 = await start_agent(procs, settings)
            assert rx2.agent_id == rx.agent_id
            t_up = time.monotonic()
            await streaming
            results = await outcomes(sent)
            settled = time.monotonic() - t_kill
            failed = [i for i, r in enumerate(results) if r is not None]
            assert all(type(results[i]).__name__ == "DeliveryError" for i in failed), results
            acked = [i for i, r in enumerate(results) if r is None]

            st2 = await rx2.stats()  # also a round trip: everything the receiver got is handled
            await eventually(lambda: len(read_log(log)) >= len(acked), timeout=5)
            ledger = Ledger(read_log(log))
            ledger.check_once_in_order()  # one session: nothing handled twice, in id order
            for i in acked:
                assert ledger.count(i) == 1, f"acknowledged message {i} handled {ledger.count(i)} times"
            # the restarted receiver serves: a request, and a new ordered session from another node
            assert (await tx.request(rx.agent_id, MessageType.PING, timeout=5)).payload is None
            async with Node(config=cfg) as other:
                other.add_peer(rx.agent_id, *rx2.addrs)
                assert await outcomes(await send_run(other, rx.agent_id, range(-5, 0))) == [None] * 5
            report(
                f"receiver SIGKILL ({kind}): {N_RECEIVER} messages; {handled_at_kill} handled and "
                f"{acked_at_kill} acknowledged at the kill, {in_flight} in flight; restarted in "
                f"{t_up - t_kill:.2f} s; every send settled {settled:.2f} s after the kill: "
                f"{len(acked)} acknowledged (each handled once), {len(failed)} DeliveryError; "
                f"{tx.stats().retransmits} retransmissions; restarted receiver refused "
                f"{st2['refused']}, gaps skipped {st2['gaps']}"
            )
            await rx2.quit()

    run(main(), timeout=120)


def test_chaos_restarted_receiver_continues_an_ordered_session_at_once(tmp_path: Path) -> None:
    """An ORDERED + ACK_REQUESTED session goes on after its receiver was killed (while idle: nothing
    in flight) and started again: the next messages are handled and acknowledged at once."""

    async def main() -> None:
        cfg = NodeConfig(sync_in_thread=False, delivery_timeout=10, **FAST)
        settings = receiver_settings(tmp_path, store_spec("sqlite", tmp_path, None), delivery_timeout=10)
        async with agents() as procs, Node(config=cfg) as tx:
            rx = await start_agent(procs, settings)
            tx.add_peer(rx.agent_id, *rx.addrs)
            assert await outcomes(await send_run(tx, rx.agent_id, range(20))) == [None] * 20
            await rx.kill()
            await start_agent(procs, settings)
            t_sent = time.monotonic()
            later = await send_run(tx, rx.agent_id, range(20, 40))
            done, _ = await asyncio.wait([asyncio.ensure_future(s.wait()) for s in later], timeout=3)
            assert len(done) == 20, f"{20 - len(done)} of 20 not acknowledged 3 s after they were sent"
            t_acked = time.monotonic() - t_sent
            ledger = Ledger(read_log(Path(settings["log"])))
            ledger.check_once_in_order()
            assert sorted(h.i for h in ledger.rows) == list(range(40))
            report(
                f"restarted receiver, ordered session (sqlite): 20 messages before the kill, 20 after "
                f"the restart, all acknowledged {t_acked:.2f} s after they were sent; "
                f"{tx.stats().retransmits} retransmissions"
            )

    run(main(), timeout=60)


@pytest.mark.parametrize("kind", STORES)
def test_chaos_restarted_receiver_handles_what_its_predecessor_held(
    kind: str, store_url: str | None, tmp_path: Path
) -> None:
    """The receiver is killed while a handler runs (its id reserved, not committed). After the
    restart the sender's retransmission of that message is handled and acknowledged once the
    dead process's reservation lapsed: within a lease (``DEFAULT_RESERVATION_LEASE_US``) of the
    kill, its last renewal."""

    async def main() -> None:
        cfg = NodeConfig(sync_in_thread=False, delivery_timeout=10, **FAST)
        settings = receiver_settings(tmp_path, store_spec(kind, tmp_path, store_url), delivery_timeout=10)
        log = Path(settings["log"])
        async with agents() as procs, Node(config=cfg) as tx:
            rx = await start_agent(procs, {**settings, "hang": [5]})
            tx.add_peer(rx.agent_id, *rx.addrs)
            sent = await send_run(tx, rx.agent_id, range(10), ordered=False)
            # all but 5 (whose handler hangs) handled, and their ACKs back at the sender: the kill
            # comes while only 5 is unanswered (an ACK still on its way when the receiver dies
            # leaves that message to be retransmitted and handled again once its lease lapsed)
            others = [s for i, s in enumerate(sent) if i != 5]
            await eventually(lambda: len(read_log(log)) == 9 and all(s.acked for s in others))
            await rx.kill()
            t_kill = time.monotonic()
            await start_agent(procs, settings)
            t_up = time.monotonic() - t_kill
            lease = DEFAULT_RESERVATION_LEASE_US / 1e6
            done, _ = await asyncio.wait([asyncio.ensure_future(sent[5].wait())], timeout=lease + 3)
            assert done and sent[5].acked, f"message 5 not acknowledged {lease + 3:.0f} s after the restart"
            t_acked = time.monotonic() - t_kill
            assert sorted(h.i for h in read_log(log)) == list(range(10))
            report(
                f"restarted receiver, held id ({kind}): killed while message 5's handler ran; "
                f"restarted in {t_up:.2f} s; message 5 handled and acknowledged {t_acked:.2f} s "
                f"after the kill (lease {lease:.0f} s); {tx.stats().retransmits} retransmissions"
            )

    run(main(), timeout=60)


@pytest.mark.slow  # 8 MiB by default; IAC_SLOW=1 sends 32 MiB
@pytest.mark.parametrize("kind", STORES)
def test_chaos_receiver_killed_mid_file_transfer(kind: str, store_url: str | None, tmp_path: Path) -> None:
    """SIGKILL of the receiver half way through ``send_file``; it starts again with the same inbox.
    The sender redials and resumes: only the chunks the receiver does not hold are sent to it, and
    the file's SHA-256 is right."""

    async def main() -> None:
        cfg = NodeConfig(sync_in_thread=False, **FAST)
        inbox = tmp_path / "inbox"
        settings = receiver_settings(tmp_path, store_spec(kind, tmp_path, store_url), inbox_dir=str(inbox))
        src = tmp_path / "big.bin"
        data = os.urandom((32 if SLOW else 8) << 20)
        src.write_bytes(data)
        digest = hashlib.sha256(data).hexdigest()
        async with agents() as procs, Node(config=cfg) as tx:
            rx = await start_agent(procs, settings)
            tx.add_peer(rx.agent_id, *rx.addrs)
            killed_at: list[int] = []

            def on_progress(p: Any) -> None:
                if p.chunks_done >= p.total // 2 and not killed_at:
                    rx.kill_now()
                    killed_at.append(p.chunks_done)

            sending = asyncio.ensure_future(
                tx.send_file(rx.agent_id, src, on_progress=on_progress, timeout=20)
            )
            await eventually(lambda: killed_at, timeout=30)
            await rx.kill()
            t_kill = time.monotonic()
            states = [p for p in inbox.iterdir() if p.name.endswith(".json")]
            assert len(states) == 1
            held = sum(b - a for a, b in json.loads(states[0].read_text())["received"])
            rx2 = await start_agent(procs, settings)
            result = await sending
            recovered = time.monotonic() - t_kill
            st2 = await rx2.stats()
            assert result.sha256 == digest and result.resumed == 1
            assert hashlib.sha256((inbox / "big.bin").read_bytes()).hexdigest() == digest
            total = result.chunks
            assert 0 < held < total
            # the restarted receiver got exactly what it lacked, nothing twice
            assert st2["files"]["chunks_received"] == total - held
            assert st2["files"]["chunk_duplicates"] == 0 and st2["files"]["received"] == 1
            # resent: at most what was in flight (the window) when the receiver died
            assert result.chunks_resent <= cfg.file_window
            assert not [p for p in inbox.iterdir() if p.name.startswith(".")]
            report(
                f"receiver SIGKILL mid-file ({kind}): {len(data) >> 20} MiB, {total} chunks; killed at "
                f"{killed_at[0]} acknowledged, {held} on record; the restarted receiver got "
                f"{total - held} chunks, {result.chunks_resent} resent; done {recovered:.2f} s after "
                f"the kill; SHA-256 verified"
            )
            await rx2.quit()

    run(main(), timeout=120)


# --- 3. Redis stopped and started again under traffic ---------------------------------------------


class DurableRedis(RedisServer):
    """A ``redis-server`` of one test, with the persistence docs/PROTOCOL.md recommends for the
    replay store (AOF, ``appendfsync always``): stopped with SIGKILL and started again on its port
    and directory, it comes back with every write it acknowledged."""

    def __init__(self, workdir: Path, port: int | None = None, *, durable: bool = True) -> None:
        super().__init__(workdir, port)
        self.durable = durable

    def start(self) -> bool:
        if not self.durable:
            return super().start()
        import redis

        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.workdir),
             "--logfile", f"redis-{self.port}.log"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1, socket_connect_timeout=1)
        deadline = time.monotonic() + 10
        try:
            while time.monotonic() < deadline and self.proc.poll() is None:
                with contextlib.suppress(redis.exceptions.ConnectionError, redis.exceptions.BusyLoadingError):
                    return bool(client.ping())
                time.sleep(0.02)
        finally:
            client.close()
        self.stop()
        return False

    def restart(self) -> None:
        """SIGKILL, then a new server on the same port and directory."""
        self.stop()
        assert self.start(), f"redis-server did not come back on port {self.port}"


@contextlib.contextmanager
def own_redis(workdir: Path, *, durable: bool) -> Iterator[DurableRedis]:
    """A Redis server of this test alone (it is stopped and started again)."""
    for _attempt in range(3):  # a probed free port can be taken before redis binds it
        server = DurableRedis(workdir, durable=durable)
        if server.start():
            break
    else:
        pytest.fail(f"redis-server did not start; see the logs in {workdir}")
    try:
        yield server
    finally:
        server.stop()


def test_chaos_redis_stopped_and_started_under_traffic(tmp_path: Path) -> None:
    """Redis (with AOF, as recommended) is killed under an ACK_REQUESTED + ORDERED stream, then
    started again. Refusals are counted (``store_unavailable``), a plain request gets ERROR
    ``busy``, no handler runs twice, and the stream continues without restarting either node."""

    async def main(server: DurableRedis) -> None:
        cfg = NodeConfig(sync_in_thread=False, delivery_timeout=20, **FAST)
        store = RedisReplayStore(server.url, replay_config(cfg), key_prefix="iac:chaos", timeout_s=0.5)
        rows: list[Handled] = []
        async with (
            Node(listen="tls://127.0.0.1:0", config=cfg, replay_store=store) as rx,
            Node(config=cfg) as tx,
        ):
            recorder(rx, rows)
            tx.add_peer(rx.agent_id, *rx.addresses)
            sent: list[Sent] = []
            stop = asyncio.Event()

            async def stream() -> None:
                i = 0
                while not stop.is_set():
                    sent.append(await tx.send(rx.agent_id, MessageType.RUN, {"i": i}, ack=True, ordered=True))
                    i += 1
                    await asyncio.sleep(0.002)

            streaming = asyncio.ensure_future(stream())
            await eventually(lambda: len(rows) >= 50)
            conn = tx.connection(rx.agent_id)
            server.stop()
            t_down = time.monotonic()
            await eventually(lambda: rx.stats().refused.get("store_unavailable", 0) >= 5)
            with pytest.raises(RemoteError) as err:
                await tx.request(rx.agent_id, MessageType.PING, timeout=5)
            assert err.value.code == "busy"
            handled_while_down = len(rows)
            await asyncio.sleep(0.5)
            assert len(rows) == handled_while_down, "nothing is handled while the store is down"
            assert server.start(), "redis-server did not come back on its port"
            t_up = time.monotonic()
            await eventually(lambda: len(rows) > handled_while_down + 20, timeout=10)
            stop.set()
            await streaming
            assert await outcomes(sent) == [None] * len(sent)
            recovered = time.monotonic() - t_up
            assert (await tx.request(rx.agent_id, MessageType.PING, timeout=5)).payload is None
            ledger = Ledger(rows)
            ledger.check_once_in_order()
            assert sorted(h.i for h in rows) == list(range(len(sent))), "each handled exactly once"
            assert tx.connection(rx.agent_id) is conn, "the same connection throughout"
            st = rx.stats()
            assert st.refused["store_unavailable"] >= 5 and st.gaps == 0
            report(
                f"Redis (AOF) down {t_up - t_down:.2f} s under an ordered stream: {len(sent)} messages, "
                f"{handled_while_down} handled before, none during; refused {dict(st.refused)}; "
                f"{tx.stats().retransmits} retransmissions; all acknowledged {recovered:.2f} s after "
                f"Redis came back; each handled once, in order; same connection"
            )

    with own_redis(tmp_path, durable=True) as server:
        run(main(server), timeout=60)


def test_chaos_redis_restart_does_not_refuse_a_lagging_sender_for_good(tmp_path: Path) -> None:
    """Redis without persistence (also a documented setup) restarts, empty. A sender whose clock is
    2 s behind (allowed: max_skew is 60 s) sends an ACK_REQUESTED message just after: it is
    delivered once the store can judge it."""

    async def main(server: DurableRedis) -> None:
        cfg = NodeConfig(sync_in_thread=False, delivery_timeout=10, **FAST)
        store = RedisReplayStore(server.url, replay_config(cfg), key_prefix="iac:chaos", timeout_s=0.5)
        rows: list[Handled] = []
        async with (
            Node(listen="tls://127.0.0.1:0", config=cfg, replay_store=store) as rx,
            Node(config=cfg, clock=OffsetClock(-2_000_000)) as tx,
        ):
            recorder(rx, rows)
            tx.add_peer(rx.agent_id, *rx.addresses)
            await asyncio.sleep(2.2)  # the store's history began when the node started
            assert await outcomes(await send_run(tx, rx.agent_id, [0])) == [None]
            server.restart()
            assert await outcomes(await send_run(tx, rx.agent_id, [1])) == [None]
            assert [h.i for h in rows] == [0, 1]

    with own_redis(tmp_path, durable=False) as server:
        run(main(server), timeout=60)


# --- 4. a SQLite store that cannot write ----------------------------------------------------------


class Disk:
    """Where the SQLite file lives, and a way to make its writes fail: a small tmpfs filled up
    (the OS way: root cannot write past a full tmpfs either), or -- where mounting is not allowed --
    a store whose transactions fail as SQLite's do on a full disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.mounted = False
        self.store: SqliteReplayStore | None = None

    def __enter__(self) -> Disk:
        self.path.mkdir()
        res = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "iacchaos", str(self.path)],
            capture_output=True,
            check=False,
        )
        self.mounted = res.returncode == 0
        return self

    def __exit__(self, *exc: object) -> None:
        if self.store is not None:
            self.store.close()
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], check=False)

    def open_store(self, config: NodeConfig) -> SqliteReplayStore:
        cls = SqliteReplayStore if self.mounted else _FailingSqlite
        self.store = cls(self.path / "replay.sqlite", replay_config(config))
        return self.store

    def fill(self) -> None:
        if not self.mounted:
            assert isinstance(self.store, _FailingSqlite)
            self.store.full = True
            return
        fd = os.open(self.path / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            for block in (1 << 20, 4096, 512):
                with contextlib.suppress(OSError):
                    while True:
                        os.write(fd, b"\0" * block)
        finally:
            os.close(fd)

    def free(self) -> None:
        if not self.mounted:
            assert isinstance(self.store, _FailingSqlite)
            self.store.full = False
            return
        (self.path / "filler").unlink()


class _FailingSqlite(SqliteReplayStore):
    """A SQLite store whose every transaction fails while ``full`` (as on a full disk)."""

    full = False

    def _transaction(self, fn: Any) -> Any:
        if self.full:
            raise StoreUnavailable(f"replay store {self._path!r} failed: database or disk is full")
        return super()._transaction(fn)


def test_chaos_sqlite_store_that_cannot_write(tmp_path: Path) -> None:
    """The SQLite store's filesystem fills up under an ACK_REQUESTED + ORDERED stream: refusals
    are counted (``store_unavailable``), a plain request gets ERROR ``busy``, nothing is handled
    while writes fail, and once there is room again everything is handled exactly once, in order,
    on the same connection."""

    async def main(disk: Disk) -> None:
        cfg = NodeConfig(sync_in_thread=False, delivery_timeout=20, **FAST)
        rows: list[Handled] = []
        async with (
            Node(listen="tls://127.0.0.1:0", config=cfg, replay_store=disk.open_store(cfg)) as rx,
            Node(config=cfg) as tx,
        ):
            recorder(rx, rows)
            tx.add_peer(rx.agent_id, *rx.addresses)
            assert await outcomes(await send_run(tx, rx.agent_id, range(30))) == [None] * 30
            conn = tx.connection(rx.agent_id)
            disk.fill()
            t_full = time.monotonic()
            during = await send_run(tx, rx.agent_id, range(30, 40))
            with pytest.raises(RemoteError) as err:
                await tx.request(rx.agent_id, MessageType.PING, timeout=5)
            assert err.value.code == "busy" and "full" in err.value.message
            await eventually(lambda: rx.stats().refused.get("store_unavailable", 0) >= 20)
            assert not any(s.acked for s in during) and len(rows) == 30
            disk.free()
            t_free = time.monotonic()
            assert await outcomes(during) == [None] * 10
            recovered = time.monotonic() - t_free
            assert (await tx.request(rx.agent_id, MessageType.PING, timeout=5)).payload is None
            Ledger(rows).check_once_in_order()
            assert [h.i for h in rows] == list(range(40))
            assert tx.connection(rx.agent_id) is conn
            st = rx.stats()
            how = "a full 16 MiB tmpfs" if disk.mounted else "a store failing as on a full disk"
            report(
                f"SQLite store on {how} for {t_free - t_full:.2f} s: 10 ordered messages and a request "
                f"meanwhile; refused {dict(st.refused)}; the 10 acknowledged {recovered:.2f} s after "
                f"there was room again, each handled once, in order; same connection"
            )

    with Disk(tmp_path / "disk") as disk:
        run(main(disk), timeout=60)


# --- 5. a clock that jumps ------------------------------------------------------------------------


def test_chaos_sender_clock_jumps_and_comes_back() -> None:
    """The sender's clock jumps 5 minutes ahead, then back, then 5 minutes behind, then back: while
    it is off its messages are refused as ``stale`` (a plain request is answered ERROR
    ``bad_request``, an ACK_REQUESTED message is not answered and is retransmitted); once it is
    right again the retransmission is handled once, and new messages go through. Messages stamped
    50 s ahead (inside max_skew) are accepted and do not block the later, earlier-stamped ones.
    No restart."""

    async def main() -> None:
        clock = OffsetClock(0)
        cfg = NodeConfig(sync_in_thread=False, delivery_timeout=20, **FAST)
        rows: list[Handled] = []
        async with (
            Node(listen="tls://127.0.0.1:0", config=cfg) as rx,
            Node(config=cfg, clock=clock) as tx,
        ):
            recorder(rx, rows)
            tx.add_peer(rx.agent_id, *rx.addresses)
            assert await outcomes(await send_run(tx, rx.agent_id, range(3))) == [None] * 3
            conn = tx.connection(rx.agent_id)
            figures = []
            for n, jump in enumerate((300, -300)):
                clock.offset_us = jump * 1_000_000
                before = rx.stats().refused.get("stale_message", 0)
                (off,) = await send_run(tx, rx.agent_id, [100 + n])
                with pytest.raises(RemoteError) as err:  # the sender judges the answer by steady time
                    await tx.request(rx.agent_id, MessageType.PING, timeout=1)
                assert err.value.code == "bad_request" and "stale" in err.value.message
                # the message, its retransmissions, the request
                await eventually(lambda b=before: rx.stats().refused.get("stale_message", 0) - b >= 3)
                stale = rx.stats().refused.get("stale_message", 0) - before
                assert not off.acked
                assert 100 + n not in {h.i for h in rows}
                clock.offset_us = 0
                t_back = time.monotonic()
                await asyncio.wait_for(off.wait(), 5)
                figures.append(f"{jump:+d} s: {stale} refused as stale, acknowledged "
                               f"{time.monotonic() - t_back:.2f} s after the clock was right")  # fmt: skip
                assert await outcomes(await send_run(tx, rx.agent_id, [110 + n])) == [None]
            clock.offset_us = 50_000_000  # ahead, but inside max_skew: accepted
            assert await outcomes(await send_run(tx, rx.agent_id, range(200, 203))) == [None] * 3
            clock.offset_us = 0  # later messages carry earlier timestamps: still accepted
            assert await outcomes(await send_run(tx, rx.agent_id, range(300, 303))) == [None] * 3
            assert (await tx.request(rx.agent_id, MessageType.PING, timeout=5)).payload is None
            Ledger(rows).check_once_in_order()
            assert [h.i for h in rows] == [0, 1, 2, 100, 110, 101, 111, 200, 201, 202, 300, 301, 302]
            assert tx.connection(rx.agent_id) is conn and rx.stats().gaps == 0
            report(f"sender clock jumps: {'; '.join(figures)}; +50 s then back: all accepted in order")

    run(main(), timeout=60)


@pytest.mark.parametrize("kind", ["memory", "sqlite", "redis"])
def test_chaos_receiver_clock_jump_does_not_reopen_replays(kind: str, tmp_path: Path, redis_url: str) -> None:
    """The receiver's clock jumps 5 minutes ahead for a moment, then back. A message handled just
    before the jump, replayed (still fresh) after it, is a duplicate: not handled again."""

    async def main() -> None:
        clock = OffsetClock(0)
        cfg = NodeConfig(sync_in_thread=False, **FAST)
        rc = replay_config(cfg)
        store: ReplayStore = {
            "memory": lambda: MemoryReplayStore(clock.now_us(), rc),
            "sqlite": lambda: SqliteReplayStore(tmp_path / "r.sqlite", rc),
            "redis": lambda: RedisReplayStore(redis_url, rc, key_prefix=f"iac:chaos:{uuid.uuid4().hex}"),
        }[kind]()
        woke: list[Any] = []
        async with Node(listen="tls://127.0.0.1:0", config=cfg, clock=clock, replay_store=store) as rx:
            rx.on(MessageType.RUN)(lambda ctx: woke.append(ctx.payload))
            async with RawPeer.connect(rx) as peer:
                captured = encode_message_frame(peer.identity, peer.message(MessageType.RUN, "once"))
                assert await peer.exchange(captured) == [] and woke == ["once"]
                clock.offset_us = 300_000_000
                await asyncio.sleep(1.5)  # the node's housekeeping runs while the clock is off
                clock.offset_us = 0
                await peer.exchange(captured)  # a replay, 2 s after the original: fresh
                assert woke == ["once"], "the replay was handled again"
                assert rx.stats().refused.get("duplicate", 0) == 1

    run(main(), timeout=60)


def test_chaos_receiver_clock_jump_keeps_ordered_sessions_flowing() -> None:
    """The receiver's clock jumps 5 minutes ahead for a moment, then back; an ORDERED +
    ACK_REQUESTED session that was running goes on at once."""

    async def main() -> None:
        clock = OffsetClock(0)
        cfg = NodeConfig(sync_in_thread=False, delivery_timeout=10, **FAST)
        rows: list[Handled] = []
        async with Node(listen="tls://127.0.0.1:0", config=cfg, clock=clock) as rx, Node(config=cfg) as tx:
            recorder(rx, rows)
            tx.add_peer(rx.agent_id, *rx.addresses)
            assert await outcomes(await send_run(tx, rx.agent_id, range(5))) == [None] * 5
            clock.offset_us = 300_000_000
            await asyncio.sleep(1.5)
            clock.offset_us = 0
            later = await send_run(tx, rx.agent_id, range(5, 10))
            done, _ = await asyncio.wait([asyncio.ensure_future(s.wait()) for s in later], timeout=3)
            assert len(done) == 5, f"{5 - len(done)} of 5 not acknowledged 3 s after they were sent"
            assert [h.i for h in rows] == list(range(10))

    run(main(), timeout=60)


# --- 6. a network partition -----------------------------------------------------------------------

PARTITION_S = 10.0 if SLOW else 2.0


def _netem() -> Any:
    from iac.testing import netem

    return netem


@pytest.mark.slow  # a 2 s partition by default; IAC_SLOW=1 runs the 10 s one
@pytest.mark.skipif(_netem().unavailable() is not None, reason=f"link emulator: {_netem().unavailable()}")
@pytest.mark.parametrize("transport", ["tls", "quic"])
def test_chaos_partition_heals(transport: str, tmp_path: Path) -> None:
    """Two node processes in two network namespaces; the link between them drops every packet for
    a while, then heals. ACK_REQUESTED messages sent during the partition are delivered after it,
    once each; a plain request during it times out (RequestTimeout); later requests succeed."""
    netem = _netem()
    from iac.testing.relay import Impairment

    clear = Impairment(delay=0.005)

    async def main(link: Any) -> None:
        async with agents() as procs:
            log = tmp_path / "handled.log"
            rx_settings = {
                "seed": seed_hex(),
                "listen": [f"{transport}://{netem.ADDR_B}:7411"],
                "log": str(log),
                "config": {**FAST, "delivery_timeout": 30},
            }
            rx = await start_agent(procs, rx_settings, link.command("b", []))
            tx_settings = {"seed": seed_hex(), "config": {**FAST, "delivery_timeout": 30},
                           "peers": {rx.agent_id: rx.addrs}}  # fmt: skip
            tx = await start_agent(procs, tx_settings, link.command("a", []))
            first = await tx.ask({"cmd": "send", "to": rx.agent_id, "items": list(range(20))}, "settled")
            assert first["settled"] == {"acked": list(range(20)), "failed": {}}

            link.set_impairment(Impairment(loss=1.0))
            t_cut = time.monotonic()
            await tx.tell({"cmd": "send", "to": rx.agent_id, "items": list(range(20, 40))})
            during = await tx.ask({"cmd": "request", "to": rx.agent_id, "timeout": 1.0}, "seconds")
            assert during.get("error") in ("RequestTimeout", "DialError", "ConnectionClosed"), during
            await asyncio.sleep(max(0.0, PARTITION_S - (time.monotonic() - t_cut)))
            assert len(read_log(log)) == 20, "nothing crossed the partition"
            link.set_impairment(clear)
            t_heal = time.monotonic()
            second = (await tx.expect("settled", 60))["settled"]
            delivered = time.monotonic() - t_heal
            assert second == {"acked": list(range(20, 40)), "failed": {}}
            after = await tx.ask({"cmd": "request", "to": rx.agent_id, "timeout": 5.0}, "seconds")
            assert after.get("reply") is True, after
            rows = read_log(log)
            Ledger(rows).check_once_in_order()
            assert [h.i for h in rows] == list(range(40)), "each once, in order"
            tx_st, rx_st = await tx.stats(), await rx.stats()
            dropped = sum(d["dropped"] for d in link.stats().values())
            report(
                f"{PARTITION_S:g} s partition ({transport}): 20 ordered messages and a request sent "
                f"during it; the request: {during['error']} after {during['seconds']:.2f} s; the 20 "
                f"acknowledged {delivered:.2f} s after the link healed, each handled once; "
                f"{tx_st['retransmits']} retransmissions, receiver refused {rx_st['refused']}, "
                f"{dropped} packets dropped by the partition"
            )
            await tx.quit()
            await rx.quit()

    with netem.Link(clear, tag=f"x{os.getpid() % 100000}") as link:
        run(main(link), timeout=120)
