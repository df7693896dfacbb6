"""The registry role and the discovery client over real loopback sockets (iac.mesh)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from conftest import run

from iac.errors import ConfigError, HandshakeError, MessageRejected, RemoteError
from iac.mesh import (
    KeyBook,
    MeshClient,
    RegistryService,
    entry_from_json,
    entry_to_json,
    lookup_request,
    parse_registry,
    registry_admission,
    serve_registry,
)
from iac.node.config import NodeConfig
from iac.node.node import Context, Node
from iac.protocol.clock import ManualClock, now_us
from iac.protocol.records import AgentRecord, SignedRecord, key_digest, sign_record
from iac.protocol.registry import KeyStatus, RegistryConfig, RegistryState, verify_entry
from iac.transport import dial
from iac.transport.dialer import DialError
from iac.wire._pb.iac_pb2 import Intent, MessageType, TaskState
from iac.wire.identity import Identity
from iac.wire.message import Session, build_message

TLS = "tls://127.0.0.1:0"


@contextlib.asynccontextmanager
async def registry(
    state: RegistryState | None = None, clock: ManualClock | None = None
) -> AsyncIterator[RegistryService]:
    async with Node(listen=[TLS]) as node:
        yield RegistryService(node, state or RegistryState(), clock=clock)


def client(node: Node, reg: RegistryService, **kw: object) -> MeshClient:
    return MeshClient(node, reg.node.agent_id, reg.node.addresses, **kw)  # type: ignore[arg-type]


def task(n: int = 1) -> TaskState:
    return TaskState(task_id=f"t-{n}", intent=Intent.ASSIGN_TASK, step=1, steps=2)  # type: ignore[arg-type]


def test_publish_and_lookup_by_id_alias_and_capability() -> None:
    async def main() -> None:
        async with registry() as reg, Node(listen=[TLS]) as a, Node() as b:

            @a.on(MessageType.RUN)
            async def echo(ctx: Context) -> object:
                return {"echo": ctx.payload}

            ma = client(a, reg, aliases=["writer.team-a"], capabilities=["write", "review"])
            mb = client(b, reg, publish=False)
            async with ma, mb:
                assert ma.record is not None and ma.record.addresses == tuple(a.addresses)
                assert await mb.resolve("writer.team-a") == a.agent_id
                assert b.peer_book[a.agent_id] == a.addresses
                assert await mb.find("write") == [a.agent_id]
                assert await mb.find("review", limit=1) == [a.agent_id]
                assert await mb.find("plan") == []
                (rec,) = await mb.lookup(agent_id=a.agent_id)
                assert rec.aliases == ("writer.team-a",) and rec.capabilities == ("review", "write")
                reply = await mb.request("writer.team-a", MessageType.RUN, {"x": 1}, timeout=5)
                assert reply.payload == {"echo": {"x": 1}}
                with pytest.raises(MessageRejected) as exc_info:
                    await mb.resolve("nobody.team-a")
                assert exc_info.value.reason == "unknown_agent"
                assert reg.counts["publish"] == 1 and reg.counts["lookup"] >= 4

    run(main())


def test_forged_expired_stale_and_foreign_records_are_refused_over_the_wire() -> None:
    async def main() -> None:
        async with registry() as reg, Node() as a:
            ma = client(a, reg, aliases=["alice"])
            async with ma:
                rec = ma.make_record()
                good = sign_record(a.identity, rec)
                forged = SignedRecord(good.data, bytes(64))
                with pytest.raises(MessageRejected) as exc_info:
                    await ma.publish_signed(forged)
                assert exc_info.value.reason == "bad_signature"
                expired = dataclasses.replace(rec, seq=rec.seq + 1, expires_us=now_us() - 1)
                with pytest.raises(MessageRejected) as exc_info:
                    await ma.publish_signed(sign_record(a.identity, expired))
                assert exc_info.value.reason == "record_expired"
                await ma.publish_signed(good)
                with pytest.raises(MessageRejected) as exc_info:
                    await ma.publish_signed(good)  # a replay: same seq
                assert exc_info.value.reason == "stale_seq"
                older = dataclasses.replace(rec, seq=rec.seq - 5)
                with pytest.raises(MessageRejected) as exc_info:
                    await ma.publish_signed(sign_record(a.identity, older))
                assert exc_info.value.reason == "stale_seq"
                other = Identity.generate()
                foreign = sign_record(other, AgentRecord(other.agent_id, 1, now_us() + 60_000_000))
                with pytest.raises(MessageRejected, match="published by the key it describes") as exc_info:
                    await ma.publish_signed(foreign)
                assert exc_info.value.reason == "bad_record"
                with pytest.raises(RemoteError, match="bad_request"):
                    await a.request(reg.node.agent_id, MessageType.REGISTER_KEY, {"op": "drop"}, timeout=5)
                assert reg.state.lookup_id(other.agent_id, now_us()) is None
                entry = reg.state.lookup_id(a.agent_id, now_us())
                assert entry is not None and entry.record.seq == rec.seq

    run(main())


def test_an_alias_belongs_to_the_first_key() -> None:
    async def main() -> None:
        async with (
            registry() as reg,
            Node() as a,
            Node() as c,
            Node() as b,
            client(a, reg, aliases=["planner"]),
            client(b, reg, publish=False) as mb,
        ):
            mc = client(c, reg, aliases=["planner"])
            with pytest.raises(MessageRejected) as exc_info:
                await mc.start()
            assert exc_info.value.reason == "alias_taken"
            assert await mb.resolve("planner") == a.agent_id

    run(main())


def test_rotation_over_the_wire_moves_aliases_and_ends_the_old_key_after_the_grace_period() -> None:
    async def main() -> None:
        clock = ManualClock(now_us())
        state = RegistryState(config=RegistryConfig(rotation_grace_us=60_000_000))
        old_id, new_id, thief = Identity.generate(), Identity.generate(), Identity.generate()
        gate_cfg = NodeConfig()
        gate_cfg = dataclasses.replace(
            gate_cfg,
            transport=dataclasses.replace(gate_cfg.transport, admission=registry_admission(state, clock)),
        )
        async with (
            registry(state, clock) as reg,
            Node(old_id, listen=[TLS]) as a,
            Node(new_id, listen=[TLS]) as a2,
            Node(listen=[TLS]) as b,
            Node(listen=[TLS], config=gate_cfg) as gate,
        ):
            ma = client(
                a,
                reg,
                aliases=["writer"],
                capabilities=["write"],
                clock=clock,
                next_key_digest=key_digest(new_id.agent_id),
            )
            mb = client(b, reg, publish=False, clock=clock, book=KeyBook(rotation_grace_us=60_000_000))
            async with ma, mb:
                # b talks to a, so a announces its rotation to b
                assert await mb.resolve("writer") == a.agent_id
                await b.request(a.agent_id, MessageType.PING, timeout=5)
                # a thief of the current key cannot rotate to a key that was not committed
                with pytest.raises(MessageRejected) as exc_info:
                    await ma.rotate(thief, notify_peers=False)
                assert exc_info.value.reason == "uncommitted_successor"
                st = await ma.rotate(new_id, new_node=a2)
                assert (st.old_agent_id, st.new_agent_id) == (old_id.agent_id, new_id.agent_id)
                assert ma.node is a2 and ma.record is not None and ma.record.agent_id == new_id.agent_id
                # the registry moved the alias and the capability
                assert await mb.resolve("writer", fresh=True) == new_id.agent_id
                assert await mb.find("write") == [new_id.agent_id]
                assert b.peer_book[new_id.agent_id][: len(a.addresses)] == a.addresses
                assert mb.book.status(old_id.agent_id, clock.now_us()) is KeyStatus.ROTATING
                assert mb.book.successor(old_id.agent_id) == new_id.agent_id
                assert await mb.resolve(old_id.agent_id) == new_id.agent_id
                # the old key can publish nothing, and a replayed record is refused
                stale = sign_record(
                    old_id, AgentRecord(old_id.agent_id, ma.next_seq(), clock.now_us() + 10**8)
                )
                with pytest.raises(MessageRejected) as exc_info:
                    await MeshClient(a, reg.node.agent_id, reg.node.addresses).publish_signed(stale)
                assert exc_info.value.reason == "key_rotated"
                assert (await mb.status(old_id.agent_id))["status"] == "rotating"
                # inside the grace period the old key is still admitted, after it not
                conn = await dial(gate.addresses[0], old_id, expect=gate.agent_id)
                await conn.close()
                clock.advance(61)
                assert state.key_status(old_id.agent_id, clock.now_us()).status is KeyStatus.ROTATED
                assert mb.book.is_ended(old_id.agent_id, clock.now_us())
                guard = mb.book.guard(clock)
                ping = await a.send(b.agent_id, MessageType.PING)
                assert ping.peer == b.agent_id
                with pytest.raises(HandshakeError) as exc_info:
                    await dial(gate.addresses[0], old_id, expect=gate.agent_id)
                assert exc_info.value.reason == "admission_denied"
                conn = await dial(gate.addresses[0], new_id, expect=gate.agent_id)
                await conn.close()
                msg = build_message(
                    sender=old_id.agent_id,
                    to=b.agent_id,
                    msg_type=MessageType.RUN,
                    session=Session(),
                    timestamp_us=clock.now_us(),
                )
                assert guard(msg, None) == "the sender's key is rotated"

    run(main())


def test_admission_mode_refuses_an_unregistered_dialer_at_hello() -> None:
    async def main() -> None:
        state = RegistryState()
        async with registry(state) as reg:
            cfg = NodeConfig()
            cfg = dataclasses.replace(
                cfg, transport=dataclasses.replace(cfg.transport, admission=registry_admission(state))
            )
            async with Node(listen=[TLS], config=cfg) as gate, Node() as x:
                with pytest.raises(HandshakeError) as exc_info:
                    await dial(gate.addresses[0], x.identity, expect=gate.agent_id)
                assert exc_info.value.reason == "admission_denied"
                x.add_peer(gate.agent_id, *gate.addresses)
                with pytest.raises(DialError) as info:
                    await x.send(gate.agent_id, MessageType.PING)
                assert info.value.attempts[-1].outcome == "admission_denied"
                async with client(x, reg):  # registered now
                    await x.request(gate.agent_id, MessageType.PING, timeout=5)

    run(main())


def test_a_failed_dial_is_re_resolved_and_retried_once(tmp_path: Path) -> None:
    async def main() -> None:
        ident = Identity.generate()
        async with registry() as reg, Node() as b:
            mb = client(b, reg, publish=False)
            async with Node(ident, listen=[TLS]) as a1, client(a1, reg, aliases=["mover"]):
                a1.expose(lambda: "first", name="where")
                assert await mb.call("mover", "where") == "first"
                first = list(a1.addresses)
            async with Node(ident, listen=[TLS]) as a2, client(a2, reg, aliases=["mover"]):
                a2.expose(lambda: "second", name="where")
                assert a2.addresses != first
                assert b.peer_book[ident.agent_id] == first  # stale until the retry re-resolves
                assert await mb.call("mover", "where") == "second"
                assert await mb.call(ident.agent_id, "where") == "second"
                assert a2.addresses[0] in b.peer_book[ident.agent_id]

    run(main())


def test_delegation_by_capability_with_timeout_policy_and_fallback() -> None:
    async def main() -> None:
        async with (
            registry() as reg,
            Node(listen=[TLS]) as slow,
            Node(listen=[TLS]) as good,
            Node(listen=[TLS]) as fb,
            Node() as boss,
        ):
            hang = asyncio.Event()

            @slow.on(MessageType.DELEGATE_TASK)
            async def stuck(ctx: Context) -> object:
                await hang.wait()
                return "never"

            @good.on(MessageType.DELEGATE_TASK)
            async def done(ctx: Context) -> object:
                return {"by": "good", "task": ctx.task.task_id if ctx.task else None}

            @fb.on(MessageType.DELEGATE_TASK)
            async def fallback(ctx: Context) -> object:
                return {"by": "fallback"}

            async with (
                client(slow, reg, capabilities=["summarize"]),
                client(good, reg, capabilities=["summarize"]),
                client(fb, reg, aliases=["fallback"]),
                client(boss, reg, publish=False) as mesh,
            ):
                assert sorted(await mesh.find("summarize")) == sorted([slow.agent_id, good.agent_id])

                def slow_first(cap: str, ids: list[str]) -> list[str]:
                    return sorted(ids, key=lambda a: a != slow.agent_id)

                r = await mesh.delegate_capability(
                    "summarize", task(1), {"doc": 1}, timeout=0.5, policy=slow_first, fallback="fallback"
                )
                assert r.payload == {"by": "good", "task": "t-1"}
                only_slow: list[str] = [slow.agent_id]
                r = await mesh.delegate_capability(
                    "summarize", task(2), timeout=0.5, policy=lambda c, ids: only_slow, fallback="fallback"
                )
                assert r.payload == {"by": "fallback"}
                r = await mesh.delegate_capability("translate", task(3), timeout=0.5, fallback=fb.agent_id)
                assert r.payload == {"by": "fallback"}
                with pytest.raises(MessageRejected) as exc_info:
                    await mesh.delegate_capability("translate", task(4), timeout=0.5)
                assert exc_info.value.reason == "unknown_agent"
                hang.set()

    run(main())


def test_refresh_before_expiry_with_an_injected_clock_and_sleep(tmp_path: Path) -> None:
    async def main() -> None:
        clock = ManualClock(now_us())
        delays: list[float] = []

        parked = asyncio.Event()

        async def fake_sleep(seconds: float) -> None:
            if len(delays) == 2:  # after the third publish: stay here until cancelled
                await parked.wait()
            delays.append(seconds)
            clock.advance(seconds)

        async with registry(clock=clock) as reg, Node(listen=[TLS]) as a, Node() as b:
            ma = client(
                a,
                reg,
                aliases=["fresh"],
                ttl=600,
                refresh=0.5,
                clock=clock,
                sleep=fake_sleep,
                seq_file=tmp_path / "seq",
            )
            mb = client(b, reg, publish=False, clock=clock)
            async with ma:
                await ma.wait_published(3)
                assert delays == [300.0, 300.0]
                # 600 s after the first publish the record is still live: it was refreshed
                assert await mb.resolve("fresh") == a.agent_id
                seqs = int((tmp_path / "seq").read_text())
                assert ma.record is not None and seqs == ma.record.seq
            clock.advance(601)  # no refresh any more: the record expires
            with pytest.raises(MessageRejected) as exc_info:
                await mb.resolve("fresh", fresh=True)
            assert exc_info.value.reason == "unknown_agent"

    run(main())


def test_bootstrap_works_without_a_registry() -> None:
    async def main() -> None:
        async with Node(listen=[TLS]) as a, Node() as b:
            a.expose(lambda x: x * 2, name="double")
            async with MeshClient(b, bootstrap={a.agent_id: a.addresses}) as mb:
                assert await mb.call(a.agent_id, "double", 21) == 42
                with pytest.raises(MessageRejected) as exc_info:
                    await mb.resolve("someone")
                assert exc_info.value.reason == "unknown_agent"

    run(main())


def test_serve_registry_on_sqlite_and_the_wire_schemas(tmp_path: Path) -> None:
    async def main() -> None:
        async with Node(listen=[TLS]) as rn, Node() as a:
            svc = serve_registry(rn, f"sqlite:{tmp_path / 'r.db'}")
            with pytest.raises(Exception, match="already serves"):
                RegistryService(rn, RegistryState())
            async with MeshClient(a, rn.agent_id, rn.addresses, aliases=["a.b"], capabilities=["c"]) as ma:
                assert ma.record is not None
                entry = svc.state.lookup_alias("a.b", now_us())
                assert entry is not None
                obj = entry_to_json(entry)
                assert set(obj) == {"aliases", "record", "rotations"}
                assert verify_entry(entry_from_json(obj), now_us()) == entry.record
                tampered = dict(obj, aliases=["a.b", "stolen"])
                with pytest.raises(MessageRejected) as exc_info:
                    verify_entry(entry_from_json(tampered), now_us())
                assert exc_info.value.reason == "bad_record"
            svc.state.store.close()

    run(main())
    assert lookup_request(capability="c", limit=3) == {"op": "lookup", "capability": "c", "limit": 3}
    aid = Identity.from_seed(b"\x0a" * 32).agent_id
    (r,) = parse_registry([f"{aid}@tls://127.0.0.1:1", f"{aid}@unix:///tmp/r.sock"])
    assert r.addresses == ("tls://127.0.0.1:1", "unix:///tmp/r.sock")
    small_order = "01" + "00" * 31  # 64 hex characters, but the identity point: not an AgentId
    with pytest.raises(ConfigError):
        parse_registry([f"{small_order}@tls://127.0.0.1:1"])
    assert KeyBook().status("b" * 64, 0) is KeyStatus.UNKNOWN
