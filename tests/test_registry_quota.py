"""The registry's neighbour bounds: a neighbour brings in at most ``forwarded_keys`` new keys an
hour by FORWARD; a direct publish into a full registry evicts a record that the neighbour which
brought in the most brought in; a record costs at most 3x its encoded size in the memory store;
a registry whose store does not answer refuses to start."""

from __future__ import annotations

import gc
import secrets
import subprocess
import sys
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from iac import Identity
from iac.errors import MessageRejected
from iac.mesh.wire import handler_error
from iac.protocol.record_store import MemoryRecordStore, RecordStore
from iac.protocol.records import AgentRecord, SignedRecord, sign_record, sign_revocation
from iac.protocol.registry import KeyStatus, RegistryConfig, RegistryState
from iac.stores.records_redis import RedisRecordStore
from iac.stores.records_sqlite import SqliteRecordStore

NOW = 1_700_000_000_000_000
SEC = 1_000_000
HOUR = 3600 * SEC
RELAY, RELAY2 = "r" * 64, "s" * 64


def signed(who: Identity, seq: int = 1, **fields: object) -> SignedRecord:
    rec = AgentRecord(agent_id=who.agent_id, seq=seq, expires_us=NOW + HOUR, **fields)  # type: ignore[arg-type]
    return sign_record(who, rec)


@pytest.fixture(params=["memory", "sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RecordStore]:
    s: RecordStore
    if request.param == "memory":
        s = MemoryRecordStore()
    elif request.param == "sqlite":
        s = SqliteRecordStore(tmp_path / "registry.db")
    else:
        s = RedisRecordStore(request.getfixturevalue("redis_url"), key_prefix=f"test:{uuid.uuid4().hex}")
    yield s
    s.close()


def test_a_neighbour_brings_in_at_most_its_quota_of_new_keys_an_hour(store: RecordStore) -> None:
    reg = RegistryState(store, RegistryConfig(forwarded_keys=3))
    keys = [Identity.generate() for _ in range(5)]
    for k in keys[:3]:
        reg.publish(signed(k), NOW, via=RELAY)
    with pytest.raises(MessageRejected, match="brought in 3 new keys within 3600 s") as err:
        reg.publish(signed(keys[3]), NOW, via=RELAY)
    assert err.value.reason == "registry_quota"
    assert handler_error(err.value).code == "busy"
    assert reg.stats.quota_refused == 1 and reg.stats.brought_in == {RELAY: 3}
    reg.publish(signed(keys[0], 2), NOW, via=RELAY)  # a key it brought in before still refreshes
    reg.publish(signed(keys[3]), NOW, via=RELAY2)  # another neighbour has its own quota
    reg.publish(signed(keys[4]), NOW)  # and a direct publish none
    assert reg.key_status(keys[3].agent_id, NOW).status is KeyStatus.ACTIVE
    late = [Identity.generate() for _ in range(2)]
    reg.publish(signed(late[0]), NOW + HOUR // 3 + 1, via=RELAY)  # a third of an hour: one key more
    with pytest.raises(MessageRejected) as exc_info:
        reg.publish(signed(late[1]), NOW + HOUR // 3 + 2, via=RELAY)
    assert exc_info.value.reason == "registry_quota"
    assert reg.stats.quota_refused == 2 and reg.count() == 6


def test_a_direct_publish_into_a_full_registry_evicts_what_the_top_neighbour_brought_in(
    store: RecordStore,
) -> None:
    reg = RegistryState(store, RegistryConfig(max_keys=6))
    throwaway = [Identity.generate() for _ in range(4)]
    other, revoked, honest = Identity.generate(), Identity.generate(), Identity.generate()
    for k in throwaway[:3]:
        reg.publish(signed(k), NOW, via=RELAY)
    reg.publish(signed(other), NOW, via=RELAY2)
    reg.publish(signed(revoked), NOW, via=RELAY)
    reg.apply_revocation(sign_revocation(revoked, seq=2, issued_us=NOW), NOW)  # never evicted
    reg.publish(signed(Identity.generate()), NOW)  # full now
    with pytest.raises(MessageRejected) as exc_info:
        reg.publish(signed(throwaway[3]), NOW, via=RELAY)  # relayed: no eviction
    assert exc_info.value.reason == "registry_full"
    reg.publish(signed(honest), NOW)  # direct: RELAY's oldest record makes room
    assert reg.count() == 6 and reg.stats.evicted == 1
    assert reg.key_status(throwaway[0].agent_id, NOW).status is KeyStatus.UNKNOWN
    assert reg.key_status(honest.agent_id, NOW).status is KeyStatus.ACTIVE
    for _ in range(3):  # RELAY's two others go next (RELAY still brought in the most), never the revoked
        reg.publish(signed(Identity.generate()), NOW)
    assert reg.key_status(revoked.agent_id, NOW).status is KeyStatus.REVOKED
    assert reg.key_status(other.agent_id, NOW).status is KeyStatus.UNKNOWN  # then RELAY2's
    with pytest.raises(MessageRejected) as exc_info:  # nothing relayed is left to evict
        reg.publish(signed(Identity.generate()), NOW)
    assert exc_info.value.reason == "registry_full"
    assert reg.stats.evicted == 4


def test_a_record_costs_at_most_three_times_its_encoded_size_in_the_memory_store() -> None:
    """The issue's record: 7.5 KiB, every field near its limit (it cost 35 KiB before)."""

    def big() -> SignedRecord:
        who = Identity.generate()
        return signed(
            who,
            aliases=tuple(f"a{j}-{secrets.token_hex(29)}.{secrets.token_hex(30)}" for j in range(16)),
            capabilities=tuple(f"c{j}-{secrets.token_hex(29)}" for j in range(64)),
            addresses=tuple(f"tls://h{j}-{secrets.token_hex(16)}.example:{4000 + j}" for j in range(16)),
        )

    records = [big().to_json_obj() for _ in range(200)]  # as a publish carries it
    reg = RegistryState(MemoryRecordStore(), RegistryConfig())
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        encoded = 0
        for obj in records:
            s = SignedRecord.from_json_obj(obj)  # the bytes the registry keeps, made here
            encoded += len(s.data) + len(s.signature)
            reg.publish(s, NOW)
            del s
        gc.collect()
        cost = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    per_record, size = cost / len(records), encoded / len(records)
    assert 7 * 1024 < size < 8 * 1024, size
    assert per_record <= 3 * size, (per_record, size)


def test_a_registry_whose_store_does_not_answer_refuses_to_start(tmp_path: Path) -> None:
    import socket

    key = tmp_path / "r.key"
    Identity.generate().save(key)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = subprocess.run(
        [sys.executable, "-m", "iac", "registry", "--key", str(key), "--listen", "tls://127.0.0.1:0",
         "--store", f"redis://127.0.0.1:{port}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 1, out
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"iac registry: error: --store redis://127.0.0.1:{port}")
    assert "Connection refused" in lines[0]
