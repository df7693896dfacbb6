"""Registry rules (iac/_registry.py) on every record store, with an explicit clock.

Each test runs on the in-memory store, on SQLite and, when ``redis-server`` and
the redis client are available, on a real Redis started by this module.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis_server import free_port

from iac import ConfigError, Identity
from iac.errors import MessageRejected, StoreUnavailable
from iac.protocol.record_store import AgentRow, MemoryRecordStore, RecordStore, RecordStoreTx
from iac.protocol.records import (
    AgentRecord,
    SignedRecord,
    SignedRotation,
    key_digest,
    sign_record,
    sign_revocation,
    sign_rotation,
)
from iac.protocol.registry import KeyStatus, RegistryConfig, RegistryState, verify_entry
from iac.stores.records import open_record_store
from iac.stores.records_redis import RedisRecordStore
from iac.stores.records_sqlite import SqliteRecordStore
from iac.wire import Domain

NOW = 1_700_000_000_000_000
SEC = 1_000_000
HOUR = 3600 * SEC
GRACE = 10 * SEC


def ident(n: int) -> Identity:
    return Identity.from_seed(bytes([n]) * 32)


A, A2, B, C, THIEF = ident(1), ident(2), ident(3), ident(4), ident(5)


def signed(
    who: Identity,
    seq: int = 1,
    *,
    aliases: tuple[str, ...] = (),
    capabilities: tuple[str, ...] = (),
    expires_us: int = NOW + HOUR,
    next_key: Identity | None = None,
    addresses: tuple[str, ...] = ("tls://127.0.0.1:4433",),
) -> SignedRecord:
    rec = AgentRecord(
        agent_id=who.agent_id,
        seq=seq,
        expires_us=expires_us,
        aliases=aliases,
        addresses=addresses,
        capabilities=capabilities,
        next_key_digest=key_digest(next_key.agent_id) if next_key else None,
    )
    return sign_record(who, rec)


# --- stores ----------------------------------------------------------------------------------


STORE_KINDS = ["memory", "sqlite", "redis"]


@pytest.fixture
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], RecordStore]]:
    """A factory of stores of one kind that all share one view (same file, same Redis prefix)."""
    kind = request.param
    made: list[RecordStore] = []
    memory = MemoryRecordStore()
    prefix = f"test:{uuid.uuid4().hex}"
    url = request.getfixturevalue("redis_url") if kind == "redis" else ""

    def factory() -> RecordStore:
        store: RecordStore
        if kind == "memory":
            store = memory
        elif kind == "sqlite":
            store = SqliteRecordStore(tmp_path / "registry.db")
        else:
            store = RedisRecordStore(url, key_prefix=prefix)
        made.append(store)
        return store

    yield factory
    for store in made:
        store.close()


ALL_STORES = pytest.mark.parametrize("make_store", STORE_KINDS, indirect=True)


def state(make_store: Callable[[], RecordStore], **kw: Any) -> RegistryState:
    policy = kw.pop("alias_policy", None)
    config = RegistryConfig(**({"rotation_grace_us": GRACE} | kw))
    return RegistryState(make_store(), config, alias_policy=policy)


# --- publish and lookups -------------------------------------------------------------------


@ALL_STORES
def test_publish_and_lookup_by_id_alias_and_capability(make_store: Callable[[], RecordStore]) -> None:
    reg = state(make_store)
    rec = reg.publish(signed(A, aliases=("planner.team-a",), capabilities=("plan", "write")), NOW)
    reg.publish(signed(B, capabilities=("write",)), NOW)
    entry = reg.lookup_id(A.agent_id, NOW)
    assert entry is not None and entry.record == rec and entry.rotations == ()
    assert verify_entry(entry, NOW) == rec
    alias_entry = reg.lookup_alias("planner.team-a", NOW)
    assert alias_entry is not None and alias_entry.agent_id == A.agent_id
    assert reg.lookup_alias("nobody", NOW) is None
    assert [e.agent_id for e in reg.lookup_capability("plan", NOW)] == [A.agent_id]
    assert [e.agent_id for e in reg.lookup_capability("write", NOW)] == sorted([A.agent_id, B.agent_id])
    assert len(reg.lookup_capability("write", NOW, limit=1)) == 1
    assert reg.lookup_capability("nothing", NOW) == []
    assert reg.key_status(A.agent_id, NOW).status is KeyStatus.ACTIVE
    assert reg.is_key_valid(A.agent_id, NOW)
    assert not reg.is_key_valid(C.agent_id, NOW)
    assert reg.key_status(C.agent_id, NOW).status is KeyStatus.UNKNOWN


@ALL_STORES
def test_expired_records_are_not_stored_or_returned(make_store: Callable[[], RecordStore]) -> None:
    reg = state(make_store)
    with pytest.raises(MessageRejected) as exc_info:
        reg.publish(signed(A, expires_us=NOW), NOW)
    assert exc_info.value.reason == "record_expired"
    reg.publish(signed(A, aliases=("a",), capabilities=("plan",), expires_us=NOW + SEC), NOW)
    later = NOW + SEC
    assert reg.lookup_id(A.agent_id, later) is None
    assert reg.lookup_alias("a", later) is None
    assert reg.lookup_capability("plan", later) == []
    assert reg.key_status(A.agent_id, later).status is KeyStatus.EXPIRED
    assert not reg.is_key_valid(A.agent_id, later)


@ALL_STORES
def test_bad_signature_is_not_stored(make_store: Callable[[], RecordStore]) -> None:
    reg = state(make_store)
    good = signed(A)
    forged = SignedRecord(good.data, THIEF.sign(Domain.RECORD, good.data))
    with pytest.raises(MessageRejected) as exc_info:
        reg.publish(forged, NOW)
    assert exc_info.value.reason == "bad_signature"
    assert reg.lookup_id(A.agent_id, NOW) is None
    assert reg.count() == 0


@ALL_STORES
def test_seq_only_grows_and_a_replayed_old_record_is_refused(make_store: Callable[[], RecordStore]) -> None:
    reg = state(make_store)
    old = signed(A, 1, aliases=("old",))
    reg.publish(old, NOW)
    with pytest.raises(MessageRejected) as exc_info:
        reg.publish(old, NOW)  # the same record again
    assert exc_info.value.reason == "stale_seq"
    new = signed(A, 5, aliases=("new",))
    reg.publish(new, NOW)
    for stale in (old, signed(A, 4), signed(A, 5, aliases=("other",))):
        with pytest.raises(MessageRejected) as exc_info:
            reg.publish(stale, NOW)
        assert exc_info.value.reason == "stale_seq"
    entry = reg.lookup_id(A.agent_id, NOW)
    assert entry is not None and entry.record.seq == 5
    assert reg.lookup_alias("old", NOW) is None  # a newer record without the alias released it
    assert reg.lookup_alias("new", NOW) is not None


@ALL_STORES
def test_registry_limits(make_store: Callable[[], RecordStore]) -> None:
    reg = state(
        make_store, max_aliases=2, max_capabilities=1, max_ttl_us=HOUR, hold_us=HOUR, max_record_size=400
    )
    with pytest.raises(MessageRejected, match="aliases") as exc_info:
        reg.publish(signed(A, aliases=("a", "b", "c")), NOW)
    assert exc_info.value.reason == "bad_record"
    with pytest.raises(MessageRejected, match="capabilities") as exc_info:
        reg.publish(signed(A, capabilities=("x", "y")), NOW)
    assert exc_info.value.reason == "bad_record"
    with pytest.raises(MessageRejected, match="lifetime") as exc_info:
        reg.publish(signed(A, expires_us=NOW + HOUR + 1), NOW)
    assert exc_info.value.reason == "bad_record"
    with pytest.raises(MessageRejected, match="over the limit") as exc_info:
        reg.publish(signed(A, addresses=tuple(f"tls://host-{i}.example:1" for i in range(12))), NOW)
    assert exc_info.value.reason == "bad_record"
    assert reg.count() == 0


# --- aliases -------------------------------------------------------------------------------


@ALL_STORES
def test_alias_belongs_to_the_first_key(make_store: Callable[[], RecordStore]) -> None:
    reg = state(make_store)
    reg.publish(signed(A, aliases=("planner", "a-only")), NOW)
    with pytest.raises(MessageRejected) as exc_info:
        reg.publish(signed(B, aliases=("b-only", "planner")), NOW)
    assert exc_info.value.reason == "alias_taken"
    assert reg.lookup_alias("b-only", NOW) is None  # the refused record left nothing behind
    assert reg.lookup_id(B.agent_id, NOW) is None
    entry = reg.lookup_alias("planner", NOW)
    assert entry is not None and entry.agent_id == A.agent_id
    # A refreshes its record without the alias: it is free again.
    reg.publish(signed(A, 2, aliases=("a-only",)), NOW)
    reg.publish(signed(B, aliases=("planner",)), NOW)
    entry = reg.lookup_alias("planner", NOW)
    assert entry is not None and entry.agent_id == B.agent_id
    with pytest.raises(MessageRejected) as exc_info:
        reg.publish(signed(A, 3, aliases=("planner",)), NOW)
    assert exc_info.value.reason == "alias_taken"


@ALL_STORES
def test_alias_is_held_after_expiry_until_purged(make_store: Callable[[], RecordStore]) -> None:
    reg = state(make_store, max_ttl_us=HOUR, hold_us=HOUR)
    reg.publish(signed(A, aliases=("planner",), expires_us=NOW + SEC), NOW)
    t = NOW + 2 * SEC
    with pytest.raises(MessageRejected) as exc_info:
        reg.publish(signed(B, aliases=("planner",), expires_us=t + SEC), t)
    assert exc_info.value.reason == "alias_taken"
    assert reg.purge(t) == 0
    t = NOW + SEC + HOUR + 1
    assert reg.purge(t) == 1
    assert reg.key_status(A.agent_id, t).status is KeyStatus.UNKNOWN
    reg.publish(signed(B, aliases=("planner",), expires_us=t + SEC), t)
    entry = reg.lookup_alias("planner", t)
    assert entry is not None and entry.agent_id == B.agent_id


@ALL_STORES
def test_alias_policy_can_grant_a_taken_alias(make_store: Callable[[], RecordStore]) -> None:
    calls: list[tuple[str, str, str]] = []

    def policy(alias: str, owner: str, claimant: str) -> bool:
        calls.append((alias, owner, claimant))
        return alias.endswith(".shared")

    reg = state(make_store, alias_policy=policy)
    reg.publish(signed(A, aliases=("x.shared", "mine")), NOW)
    with pytest.raises(MessageRejected) as exc_info:
        reg.publish(signed(B, aliases=("mine",)), NOW)
    assert exc_info.value.reason == "alias_taken"
    reg.publish(signed(B, aliases=("x.shared",)), NOW)
    assert ("x.shared", A.agent_id, B.agent_id) in calls
    entry = reg.lookup_alias("x.shared", NOW)
    assert entry is not None and entry.agent_id == B.agent_id
    a_entry = reg.lookup_id(A.agent_id, NOW)
    assert a_entry is not None and a_entry.record.aliases == ("mine",)
    assert verify_entry(a_entry, NOW).aliases == ("mine",)  # a subset of what A signed


# --- rotation ----------------------------------------------------------------------------------


@ALL_STORES
def test_rotation_moves_record_and_aliases_and_the_old_key_expires_after_grace(
    make_store: Callable[[], RecordStore],
) -> None:
    reg = state(make_store)
    reg.publish(signed(A, 3, aliases=("planner",), capabilities=("plan",), next_key=A2), NOW)
    rotation = sign_rotation(A, A2, seq=4, issued_us=NOW)
    reg.apply_rotation(rotation, NOW)

    entry = reg.lookup_alias("planner", NOW)
    assert entry is not None and entry.agent_id == A2.agent_id
    assert entry.record.seq == 4 and entry.record.next_key_digest is None
    assert entry.rotations == (rotation,)
    assert verify_entry(entry, NOW).agent_id == A2.agent_id
    assert [e.agent_id for e in reg.lookup_capability("plan", NOW)] == [A2.agent_id]
    assert reg.lookup_id(A.agent_id, NOW) is None

    info = reg.key_status(A.agent_id, NOW)
    assert info.status is KeyStatus.ROTATING and info.successor == A2.agent_id
    assert reg.is_key_valid(A.agent_id, NOW + GRACE - 1)
    assert not reg.is_key_valid(A.agent_id, NOW + GRACE)
    assert reg.key_status(A.agent_id, NOW + GRACE).status is KeyStatus.ROTATED
    assert reg.is_key_valid(A2.agent_id, NOW + GRACE)

    with pytest.raises(MessageRejected) as exc_info:
        reg.apply_rotation(rotation, NOW)  # replayed statement
    assert exc_info.value.reason == "stale_seq"
    with pytest.raises(MessageRejected) as exc_info:
        reg.publish(signed(A, 9, aliases=("planner",)), NOW)
    assert exc_info.value.reason == "key_rotated"
    with pytest.raises(MessageRejected) as exc_info:
        reg.publish(signed(A, 3, aliases=("planner",), next_key=A2), NOW)  # replayed old record
    assert exc_info.value.reason == "stale_seq"
    with pytest.raises(MessageRejected) as exc_info:
        reg.publish(signed(A2, 4, aliases=("planner",)), NOW)  # the successor continues the seq
    assert exc_info.value.reason == "stale_seq"
    reg.publish(signed(A2, 5, aliases=("planner",), capabilities=("plan",)), NOW)
    entry = reg.lookup_alias("planner", NOW)
    assert entry is not None and entry.rotations == () and entry.record.seq == 5


@ALL_STORES
def test_a_stolen_current_key_cannot_rotate_to_a_key_that_was_not_committed(
    make_store: Callable[[], RecordStore],
) -> None:
    reg = state(make_store)
    reg.publish(signed(A, 1, aliases=("planner",), next_key=A2), NOW)
    with pytest.raises(MessageRejected) as exc_info:
        reg.apply_rotation(sign_rotation(A, THIEF, seq=2, issued_us=NOW), NOW)
    assert exc_info.value.reason == "uncommitted_successor"
    # nor re-commit first: a later record must keep the committed digest
    with pytest.raises(MessageRejected) as exc_info:
        reg.publish(signed(A, 2, aliases=("planner",), next_key=THIEF), NOW)
    assert exc_info.value.reason == "commitment_changed"
    with pytest.raises(MessageRejected) as exc_info:
        reg.publish(signed(A, 2, aliases=("planner",)), NOW)
    assert exc_info.value.reason == "commitment_changed"
    # nor name the committed key without holding it (no countersignature)
    good = sign_rotation(A, A2, seq=2, issued_us=NOW)
    with pytest.raises(MessageRejected) as exc_info:
        reg.apply_rotation(
            SignedRotation(good.data, good.old_signature, THIEF.sign(Domain.ROTATE, good.data)), NOW
        )
    assert exc_info.value.reason == "bad_signature"
    assert reg.key_status(A.agent_id, NOW).status is KeyStatus.ACTIVE
    entry = reg.lookup_alias("planner", NOW)
    assert entry is not None and entry.agent_id == A.agent_id
    reg.publish(signed(A, 2, aliases=("planner",), next_key=A2), NOW)  # same commitment: fine
    reg.apply_rotation(sign_rotation(A, A2, seq=3, issued_us=NOW), NOW)
    assert reg.key_status(A.agent_id, NOW).successor == A2.agent_id


@ALL_STORES
def test_rotation_without_commitment_and_chained_rotations(make_store: Callable[[], RecordStore]) -> None:
    reg = state(make_store)
    reg.publish(signed(A, 1, aliases=("w",)), NOW)
    reg.apply_rotation(sign_rotation(A, B, seq=2, issued_us=NOW), NOW)
    reg.apply_rotation(sign_rotation(B, C, seq=3, issued_us=NOW), NOW)
    entry = reg.lookup_alias("w", NOW)
    assert entry is not None and entry.agent_id == C.agent_id and len(entry.rotations) == 2
    assert verify_entry(entry, NOW).seq == 3
    assert reg.key_status(B.agent_id, NOW).successor == C.agent_id


@ALL_STORES
def test_rotation_refusals(make_store: Callable[[], RecordStore]) -> None:
    reg = state(make_store, max_rotation_chain=1)
    with pytest.raises(MessageRejected) as exc_info:
        reg.apply_rotation(sign_rotation(A, A2, seq=2, issued_us=NOW), NOW)
    assert exc_info.value.reason == "unknown_agent"
    reg.publish(signed(A, 5), NOW)
    reg.publish(signed(B, 1), NOW)
    with pytest.raises(MessageRejected) as exc_info:
        reg.apply_rotation(sign_rotation(A, A2, seq=5, issued_us=NOW), NOW)
    assert exc_info.value.reason == "stale_seq"
    with pytest.raises(MessageRejected, match="already known") as exc_info:
        reg.apply_rotation(sign_rotation(A, B, seq=6, issued_us=NOW), NOW)
    assert exc_info.value.reason == "rotation_refused"
    with pytest.raises(MessageRejected, match="future") as exc_info:
        reg.apply_rotation(sign_rotation(A, A2, seq=6, issued_us=NOW + HOUR), NOW)
    assert exc_info.value.reason == "bad_record"
    reg.apply_rotation(sign_rotation(A, A2, seq=6, issued_us=NOW), NOW)
    with pytest.raises(MessageRejected, match="rotations") as exc_info:
        reg.apply_rotation(sign_rotation(A2, C, seq=7, issued_us=NOW), NOW)
    assert exc_info.value.reason == "rotation_refused"
    with pytest.raises(MessageRejected) as exc_info:
        reg.apply_rotation(sign_rotation(A, C, seq=8, issued_us=NOW), NOW)
    assert exc_info.value.reason == "key_rotated"


# --- revocation --------------------------------------------------------------------------------


@ALL_STORES
def test_revocation_ends_a_key_at_once(make_store: Callable[[], RecordStore]) -> None:
    reg = state(make_store)
    reg.publish(signed(A, 3, aliases=("planner",), capabilities=("plan",)), NOW)
    old_revocation = sign_revocation(A, seq=2, issued_us=NOW)
    with pytest.raises(MessageRejected) as exc_info:
        reg.apply_revocation(old_revocation, NOW)  # older than the stored record: a replay
    assert exc_info.value.reason == "stale_seq"
    revocation = sign_revocation(A, seq=4, issued_us=NOW, reason="compromised")
    reg.apply_revocation(revocation, NOW)
    assert reg.key_status(A.agent_id, NOW).status is KeyStatus.REVOKED
    assert not reg.is_key_valid(A.agent_id, NOW)
    assert reg.lookup_id(A.agent_id, NOW) is None
    assert reg.lookup_alias("planner", NOW) is None
    assert reg.lookup_capability("plan", NOW) == []
    with pytest.raises(MessageRejected) as exc_info:
        reg.publish(signed(A, 9, aliases=("planner",)), NOW)
    assert exc_info.value.reason == "key_revoked"
    with pytest.raises(MessageRejected) as exc_info:
        reg.apply_revocation(revocation, NOW)
    assert exc_info.value.reason == "stale_seq"
    with pytest.raises(MessageRejected) as exc_info:  # a dead key's alias is not up for grabs
        reg.publish(signed(THIEF, 1, aliases=("planner",)), NOW)
    assert exc_info.value.reason == "alias_taken"
    with pytest.raises(MessageRejected) as exc_info:  # no commitment: a revoked key cannot rotate
        reg.apply_rotation(sign_rotation(A, A2, seq=5, issued_us=NOW), NOW)
    assert exc_info.value.reason == "key_revoked"


@ALL_STORES
def test_revocation_cuts_the_rotation_grace_short(make_store: Callable[[], RecordStore]) -> None:
    reg = state(make_store)
    reg.publish(signed(A, 1), NOW)
    reg.apply_rotation(sign_rotation(A, A2, seq=2, issued_us=NOW), NOW)
    assert reg.is_key_valid(A.agent_id, NOW + 1)
    reg.apply_revocation(sign_revocation(A, seq=3, issued_us=NOW + 1), NOW + 1)
    assert not reg.is_key_valid(A.agent_id, NOW + 1)
    info = reg.key_status(A.agent_id, NOW + 1)
    assert info.status is KeyStatus.REVOKED and info.successor == A2.agent_id
    assert reg.is_key_valid(A2.agent_id, NOW + 1)


@ALL_STORES
def test_revoking_an_unknown_key_blocks_its_registration(make_store: Callable[[], RecordStore]) -> None:
    reg = state(make_store)
    reg.apply_revocation(sign_revocation(A, seq=1, issued_us=NOW), NOW)
    with pytest.raises(MessageRejected) as exc_info:
        reg.publish(signed(A, 2), NOW)
    assert exc_info.value.reason == "key_revoked"
    with pytest.raises(MessageRejected) as exc_info:
        reg.publish(signed(A, 1), NOW)
    assert exc_info.value.reason == "stale_seq"


@ALL_STORES
def test_a_revoked_key_may_still_rotate_to_its_committed_successor(
    make_store: Callable[[], RecordStore],
) -> None:
    reg = state(make_store)
    reg.publish(signed(A, 1, aliases=("planner",), capabilities=("plan",), next_key=A2), NOW)
    reg.apply_revocation(sign_revocation(A, seq=2, issued_us=NOW), NOW)
    with pytest.raises(MessageRejected) as exc_info:
        reg.apply_rotation(sign_rotation(A, THIEF, seq=3, issued_us=NOW), NOW)
    assert exc_info.value.reason == "uncommitted_successor"
    reg.apply_rotation(sign_rotation(A, A2, seq=3, issued_us=NOW), NOW)
    assert reg.key_status(A.agent_id, NOW).status is KeyStatus.REVOKED  # no grace for a revoked key
    entry = reg.lookup_alias("planner", NOW)
    assert entry is not None and entry.agent_id == A2.agent_id
    assert [e.agent_id for e in reg.lookup_capability("plan", NOW)] == [A2.agent_id]


# --- bounds and atomicity ----------------------------------------------------------------------


@ALL_STORES
def test_max_keys_and_purge_make_room(make_store: Callable[[], RecordStore]) -> None:
    reg = state(make_store, max_keys=2, max_ttl_us=HOUR, hold_us=HOUR)
    reg.publish(signed(A, expires_us=NOW + SEC), NOW)
    reg.publish(signed(B), NOW)
    with pytest.raises(MessageRejected) as exc_info:
        reg.publish(signed(C), NOW)
    assert exc_info.value.reason == "registry_full"
    with pytest.raises(MessageRejected) as exc_info:
        reg.apply_revocation(sign_revocation(C, seq=1, issued_us=NOW), NOW)
    assert exc_info.value.reason == "registry_full"
    reg.publish(signed(B, 2), NOW)  # a known key still refreshes
    t = NOW + SEC + HOUR + 1  # A's record is past expiry + hold: purged to make room
    reg.publish(signed(C, expires_us=t + SEC), t)
    assert reg.count() == 2
    assert reg.key_status(A.agent_id, t).status is KeyStatus.UNKNOWN


@ALL_STORES
def test_purge_keeps_ended_keys(make_store: Callable[[], RecordStore]) -> None:
    reg = state(make_store, max_ttl_us=HOUR, hold_us=HOUR)
    reg.publish(signed(A, 1, aliases=("planner",), expires_us=NOW + SEC), NOW)
    reg.apply_revocation(sign_revocation(A, seq=2, issued_us=NOW), NOW)
    t = NOW + SEC + HOUR + 1
    assert reg.purge(t) == 1
    assert reg.key_status(A.agent_id, t).status is KeyStatus.REVOKED
    reg.publish(signed(B, aliases=("planner",), expires_us=t + SEC), t)  # the alias was freed


@ALL_STORES
def test_a_failing_transaction_writes_nothing(make_store: Callable[[], RecordStore]) -> None:
    store = make_store()

    def fn(tx: RecordStoreTx) -> None:
        tx.put(AgentRow(A.agent_id, 1, expires_us=NOW + HOUR, aliases=("x",), capabilities=("c",)))
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        store.atomic(fn)
    assert store.atomic(lambda tx: (tx.get(A.agent_id), tx.alias_owner("x"), tx.count())) == (None, None, 0)
    assert store.atomic(lambda tx: tx.with_capability("c", NOW, 10)) == []


@pytest.mark.parametrize("make_store", ["sqlite", "redis"], indirect=True)
def test_two_registries_on_one_store_share_one_view(make_store: Callable[[], RecordStore]) -> None:
    one, two = state(make_store), state(make_store)
    assert one.store is not two.store  # two connections to one file / one Redis
    one.publish(signed(A, 2, aliases=("planner",), capabilities=("plan",)), NOW)
    entry = two.lookup_alias("planner", NOW)
    assert entry is not None and entry.record.seq == 2
    assert [e.agent_id for e in two.lookup_capability("plan", NOW)] == [A.agent_id]
    with pytest.raises(MessageRejected) as exc_info:
        two.publish(signed(A, 1, aliases=("planner",)), NOW)
    assert exc_info.value.reason == "stale_seq"
    with pytest.raises(MessageRejected) as exc_info:
        two.publish(signed(B, 1, aliases=("planner",)), NOW)
    assert exc_info.value.reason == "alias_taken"
    two.apply_revocation(sign_revocation(A, seq=3, issued_us=NOW), NOW)
    assert one.key_status(A.agent_id, NOW).status is KeyStatus.REVOKED


@pytest.mark.parametrize("make_store", ["sqlite", "redis"], indirect=True)
def test_concurrent_claims_of_one_alias_have_one_winner(make_store: Callable[[], RecordStore]) -> None:
    claimants = [ident(10 + i) for i in range(8)]
    records = [signed(c, aliases=("contested",)) for c in claimants]
    registries = [state(make_store) for _ in claimants]
    results: list[str] = []
    barrier = threading.Barrier(len(claimants))

    def claim(reg: RegistryState, rec: SignedRecord) -> None:
        barrier.wait()
        try:
            reg.publish(rec, NOW)
            results.append("ok")
        except MessageRejected as exc:
            assert exc.reason == "alias_taken"
            results.append("taken")

    threads = [threading.Thread(target=claim, args=pair) for pair in zip(registries, records, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(results) == ["ok"] + ["taken"] * (len(claimants) - 1)
    entry = registries[0].lookup_alias("contested", NOW)
    assert entry is not None
    assert registries[0].count() == 1


def test_open_record_store_specs(tmp_path: Path) -> None:
    assert isinstance(open_record_store("memory"), MemoryRecordStore)
    store = open_record_store(f"sqlite:{tmp_path / 'r.db'}")
    assert isinstance(store, SqliteRecordStore)
    store.close()
    for bad in ("sqlite:", "postgres://x", ""):
        with pytest.raises(ConfigError):
            open_record_store(bad)


def test_config_is_validated() -> None:
    with pytest.raises(ConfigError):
        RegistryConfig(max_keys=0)
    with pytest.raises(ConfigError):
        RegistryConfig(max_ttl_us=2 * HOUR, hold_us=HOUR)


def test_unreachable_redis_is_a_store_error() -> None:
    reg = RegistryState(RedisRecordStore(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.2))
    with pytest.raises(StoreUnavailable):
        reg.publish(signed(A), NOW)


def test_unwritable_sqlite_path_is_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailable):
        SqliteRecordStore(tmp_path / "missing-dir" / "r.db")


_CHILD = """
import sys
from iac import Identity
from iac.protocol.records import AgentRecord, sign_record
from iac.protocol.registry import RegistryState
from iac.stores.records_sqlite import SqliteRecordStore

path, now = sys.argv[1], int(sys.argv[2])
reg = RegistryState(SqliteRecordStore(path))
for seed, seq, alias in ((1, 1, "planner"), (3, 1, "child")):
    who = Identity.from_seed(bytes([seed]) * 32)
    rec = AgentRecord(agent_id=who.agent_id, seq=seq, expires_us=now + 3_600_000_000, aliases=(alias,))
    try:
        reg.publish(sign_record(who, rec), now)
        print("ok")
    except Exception as exc:
        print(getattr(exc, "reason", repr(exc)))
"""


def test_sqlite_file_is_shared_across_processes(tmp_path: Path) -> None:
    path = tmp_path / "registry.db"
    reg = RegistryState(SqliteRecordStore(path))
    reg.publish(signed(A, 2, aliases=("planner",)), NOW)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), str(NOW)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.split() == ["stale_seq", "ok"]
    entry = reg.lookup_alias("child", NOW)
    assert entry is not None and entry.agent_id == B.agent_id
