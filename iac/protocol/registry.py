"""The registry's rules, sans-IO, over a pluggable record store.

:class:`RegistryState` takes signed records and statements with the current time
and decides; a :class:`~iac.protocol.record_store.RecordStore` keeps the rows (in
memory by default; :mod:`iac.stores` has a SQLite file shared by several
processes and Redis shared by several hosts). Every decision reads and writes in
one atomic store transaction, so two registries on one store never both accept
the same ``seq`` or hand one alias to two keys.

Rules (docs/PROTOCOL.md, "Registry rules"):

* **Publish.** A record is stored only if its signature verifies, it is not
  expired, its lifetime is at most ``max_ttl_us``, it is within the registry's
  limits and its ``seq`` is above the highest ``seq`` seen for that key (from a
  record or a statement). A key that was rotated or revoked publishes nothing.
  Once a key has committed to a ``next_key_digest``, every later record of that
  key must carry the same digest (otherwise a thief of the key could first
  re-commit to a key of its own, then rotate).
* **Aliases.** An alias belongs to the key that registered it first, for as long
  as that key's stored record lists it (a newer record without it releases it),
  including ``hold_us`` after the record expires and while the key is revoked
  (so nobody can grab the name of a dead key). An ``alias_policy`` hook may grant
  a taken alias to the claimant; otherwise ``alias_taken``.
* **Rotation.** Signed by the old key and countersigned by the new one, ``seq``
  above the old key's, the new key matching the committed ``next_key_digest``
  (if any) and unknown to the registry. The old key's record, aliases and
  capabilities move to the successor (served with the rotation as proof); the
  old key stays valid for ``rotation_grace_us`` after ``min(issued_us, now)``,
  then is refused. A revoked key may still rotate, but only to the successor
  it committed to (so its owner recovers the aliases; a thief cannot).
* **Revocation.** Signed by the key itself, ``seq`` above the key's; ends the
  key at once (also a rotated key's grace). A revocation of a key the registry
  does not know is kept, so that key can never register later.
* **Neighbours** (:mod:`iac.protocol.neighbours`). A neighbour brings in at most
  ``forwarded_keys`` new keys an hour by FORWARD (``registry_quota``); in a full registry
  a direct publish evicts a record brought in through the neighbour that brought in the most.
* **Bounds.** ``max_keys`` rows (rotated and revoked keys count and are kept),
  records of at most ``max_record_size`` bytes, ``max_aliases``,
  ``max_addresses`` and ``max_capabilities`` per record, ``max_lookup`` results.
  :meth:`RegistryState.purge` drops records ``hold_us`` after they expired (and
  runs by itself when the registry is full).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum

from iac.errors import ConfigError, MessageRejected
from iac.protocol.neighbours import Neighbours, RegistryStats
from iac.protocol.record_store import AgentRow, KeyState, MemoryRecordStore, RecordStore, RecordStoreTx
from iac.protocol.records import (
    AgentRecord,
    Revocation,
    RotationStatement,
    SignedRecord,
    SignedRevocation,
    SignedRotation,
    canonical_json,
    check_successor,
    decode_record,
    is_alias,
    is_capability,
    open_record,
    open_revocation,
    open_rotation,
)
from iac.wire.identity import check_agent_id, is_agent_id

_MINUTE_US = 60_000_000
_DAY_US = 24 * 60 * _MINUTE_US


class KeyStatus(Enum):
    """What :meth:`RegistryState.key_status` says of a key at a given time."""

    #: The registry holds nothing about this key.
    UNKNOWN = "unknown"
    #: Registered, record unexpired.
    ACTIVE = "active"
    #: Registered, but its record expired (not returned by lookups).
    EXPIRED = "expired"
    #: Rotated to a successor, still inside the grace period: still accepted.
    ROTATING = "rotating"
    #: Rotated and past the grace period: refused.
    ROTATED = "rotated"
    #: Revoked: refused.
    REVOKED = "revoked"


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """What the registry knows of one key: its status and the highest ``seq`` seen for it."""

    status: KeyStatus
    #: highest ``seq`` seen for the key (record or statement); 0 when unknown
    seq: int = 0
    #: the successor's AgentId after a rotation, else ""
    successor: str = ""


#: ``alias_policy(alias, owner_agent_id, claimant_agent_id) -> bool``: True grants the
#: alias, held by ``owner``, to ``claimant`` (the owner loses it).
AliasPolicy = Callable[[str, str, str], bool]


@dataclass(frozen=True, slots=True)
class RegistryConfig:
    """Limits and periods of a registry. Times in microseconds."""

    max_keys: int = 100_000
    max_record_size: int = 8 * 1024
    max_aliases: int = 16
    max_addresses: int = 16
    max_capabilities: int = 64
    #: longest accepted ``expires_us - now`` of a record
    max_ttl_us: int = 7 * _DAY_US
    #: how long an expired record (and its aliases) is kept; at least ``max_ttl_us``
    hold_us: int = 7 * _DAY_US
    #: how long a rotated key stays valid after its rotation
    rotation_grace_us: int = 60 * _MINUTE_US
    #: how far in the future a statement's ``issued_us`` may be
    max_skew_us: int = _MINUTE_US
    #: most results of a capability lookup
    max_lookup: int = 100
    #: most rotations between a stored record and the key serving it
    max_rotation_chain: int = 8
    #: most new keys one neighbour may bring in by FORWARD (publishes it relayed for keys the
    #: registry did not hold) per ``forwarded_keys_period_us``; beyond, ``registry_quota``
    forwarded_keys: int = 100
    forwarded_keys_period_us: int = 60 * _MINUTE_US

    def __post_init__(self) -> None:
        for name in (
            "max_keys",
            "max_record_size",
            "max_ttl_us",
            "hold_us",
            "max_skew_us",
            "max_lookup",
            "max_rotation_chain",
            "forwarded_keys",
            "forwarded_keys_period_us",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be positive")
        for name in ("max_aliases", "max_addresses", "max_capabilities", "rotation_grace_us"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative")
        if self.hold_us < self.max_ttl_us:
            raise ConfigError(
                "hold_us must be at least max_ttl_us (a purged key's old records must be expired)"
            )


# --- the registry ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RegistryEntry:
    """A lookup result.

    ``record`` is what the registry serves for ``agent_id`` (after a rotation:
    the predecessor's record re-addressed to the successor, with the rotation's
    ``seq`` and no ``next_key_digest``; its aliases are the ones the key holds).
    ``signed`` and ``rotations`` let a client check it: ``signed`` verifies by
    its own ``agent_id`` and each rotation hands over to the next key.
    """

    record: AgentRecord
    signed: SignedRecord
    rotations: tuple[SignedRotation, ...] = ()

    @property
    def agent_id(self) -> str:
        return self.record.agent_id


def verify_entry(entry: RegistryEntry, now_us: int) -> AgentRecord:
    """A client's check of a lookup result: the signed record verifies and is unexpired, each
    rotation is signed by the key before it (and countersigned), follows its ``seq`` and, for the
    first one, matches the record's ``next_key_digest``; the served record is what they prove.

    Returns ``entry.record``; raises ``bad_record`` (or the check's own error) otherwise.
    """
    base = open_record(entry.signed.data, entry.signed.signature, now_us)
    current, digest, seq = base.agent_id, base.next_key_digest, base.seq
    for rotation in entry.rotations:
        statement = open_rotation(rotation, now_us, next_key_digest=digest)
        if statement.old_agent_id != current or statement.seq <= seq:
            raise MessageRejected("the rotations do not chain from the signed record", reason="bad_record")
        current, digest, seq = statement.new_agent_id, None, statement.seq
    served = entry.record
    expected = replace(base, agent_id=current, seq=seq, next_key_digest=digest, aliases=served.aliases)
    if served != expected or not set(served.aliases) <= set(base.aliases):
        raise MessageRejected("the served record is not the one its signatures prove", reason="bad_record")
    return served


def _rotation_envelope(signed: SignedRotation) -> bytes:
    return canonical_json(signed.to_json_obj())


def _rotation_from_envelope(data: bytes) -> SignedRotation:
    return SignedRotation.from_json_obj(json.loads(data))


class RegistryState:
    """The registry's decisions, over a :class:`RecordStore` (in memory by default).

    Every method takes ``now_us`` (microseconds since the Unix epoch) and reads no
    clock. Refusals raise :class:`~iac.MessageRejected` subclasses; a failing
    store raises ``StoreUnavailable``.
    """

    def __init__(
        self,
        store: RecordStore | None = None,
        config: RegistryConfig | None = None,
        *,
        alias_policy: AliasPolicy | None = None,
    ) -> None:
        self.store: RecordStore = store if store is not None else MemoryRecordStore()
        self.config = config if config is not None else RegistryConfig()
        self._alias_policy = alias_policy
        cfg = self.config
        self._neighbours = Neighbours(cfg.forwarded_keys, cfg.forwarded_keys_period_us, cfg.max_keys)
        self.stats: RegistryStats = self._neighbours.stats

    # --- publish -------------------------------------------------------------------------------

    def publish(self, signed: SignedRecord, now_us: int, *, via: str | None = None) -> AgentRecord:
        """Store a signed record; return it (``via``: the neighbour that relayed it, if not its key)."""
        cfg = self.config
        record = open_record(signed.data, signed.signature, now_us, max_size=cfg.max_record_size)
        for name, values, limit in (
            ("aliases", record.aliases, cfg.max_aliases),
            ("addresses", record.addresses, cfg.max_addresses),
            ("capabilities", record.capabilities, cfg.max_capabilities),
        ):
            if len(values) > limit:
                raise MessageRejected(
                    f"{name}: {len(values)} entries, over this registry's limit of {limit}",
                    reason="bad_record",
                )
        if record.expires_us - now_us > cfg.max_ttl_us:
            raise MessageRejected(
                f"record lifetime is over this registry's limit of {cfg.max_ttl_us} µs", reason="bad_record"
            )
        row = AgentRow(
            agent_id=record.agent_id,
            seq=record.seq,
            next_key_digest=record.next_key_digest or "",
            expires_us=record.expires_us,
            record=bytes(signed.data),
            signature=bytes(signed.signature),
            aliases=record.aliases,
            capabilities=record.capabilities,
        )

        relayed = via if via is not None and via != record.agent_id else None
        evicted: list[str] = []

        def txn(tx: RecordStoreTx) -> bool:
            evicted.clear()  # a store may run the transaction again
            old = tx.get(record.agent_id)
            if old is not None:
                if record.seq <= old.seq:
                    raise MessageRejected(
                        f"seq {record.seq} is not above the stored {old.seq}", reason="stale_seq"
                    )
                _refuse_ended(old)
                if old.next_key_digest and record.next_key_digest != old.next_key_digest:
                    raise MessageRejected(
                        "a committed next_key_digest can only be used by a rotation",
                        reason="commitment_changed",
                    )
            else:
                self._neighbours.check(relayed, now_us)
                self._make_room(tx, now_us, evicted if relayed is None else None)
            losers: dict[str, list[str]] = {}
            for alias in record.aliases:
                owner = tx.alias_owner(alias)
                if owner is None or owner == record.agent_id:
                    continue
                owner_row = tx.get(owner)
                if owner_row is None or alias not in owner_row.aliases:
                    continue  # a stale index entry: the alias is free
                if self._alias_policy is not None and self._alias_policy(alias, owner, record.agent_id):
                    losers.setdefault(owner, []).append(alias)
                    continue
                raise MessageRejected(f"alias {alias!r} belongs to {owner[:16]}…", reason="alias_taken")
            for owner, lost in losers.items():
                owner_row = tx.get(owner)
                if owner_row is not None:
                    tx.put(replace(owner_row, aliases=tuple(a for a in owner_row.aliases if a not in lost)))
            tx.put(row)
            return old is None

        self._neighbours.run(lambda: self.store.atomic(txn), relayed, record.agent_id, evicted, now_us)
        return record

    # --- statements ----------------------------------------------------------------------------

    def apply_rotation(self, signed: SignedRotation, now_us: int) -> RotationStatement:
        """Hand the old key's record, aliases and capabilities to its successor."""
        cfg = self.config
        # Both signatures first (nothing unsigned reaches the store); the commitment inside.
        statement = open_rotation(signed, now_us, next_key_digest=None, max_skew_us=cfg.max_skew_us)
        envelope = _rotation_envelope(signed)

        def txn(tx: RecordStoreTx) -> RotationStatement:
            old = tx.get(statement.old_agent_id)
            if old is None:
                raise MessageRejected(f"no record of {statement.old_agent_id[:16]}…", reason="unknown_agent")
            if statement.seq <= old.seq:
                raise MessageRejected(
                    f"rotation seq {statement.seq} is not above the stored {old.seq}", reason="stale_seq"
                )
            if old.state is KeyState.ROTATED:
                raise MessageRejected(f"{old.agent_id[:16]}… was already rotated", reason="key_rotated")
            if old.state is KeyState.REVOKED and not old.next_key_digest:
                raise MessageRejected(
                    f"{old.agent_id[:16]}… is revoked and committed to no successor", reason="key_revoked"
                )
            check_successor(statement, old.next_key_digest or None)
            if tx.get(statement.new_agent_id) is not None:
                raise MessageRejected(
                    f"the successor {statement.new_agent_id[:16]}… is already known",
                    reason="rotation_refused",
                )
            if len(old.proof) >= cfg.max_rotation_chain:
                raise MessageRejected(
                    f"more than {cfg.max_rotation_chain} rotations since the last record",
                    reason="rotation_refused",
                )
            self._make_room(tx, now_us)
            capabilities = decode_record(old.record).capabilities if old.record else ()
            ended = min(statement.issued_us, now_us)
            tx.put(
                replace(
                    old,
                    seq=statement.seq,
                    state=KeyState.ROTATED if old.state is KeyState.ACTIVE else old.state,
                    successor=statement.new_agent_id,
                    ended_us=ended if old.state is KeyState.ACTIVE else old.ended_us,
                    expires_us=0,
                    record=b"",
                    signature=b"",
                    proof=(),
                    aliases=(),
                    capabilities=(),
                )
            )
            tx.put(
                AgentRow(
                    agent_id=statement.new_agent_id,
                    seq=statement.seq,
                    expires_us=old.expires_us,
                    record=old.record,
                    signature=old.signature,
                    proof=(*old.proof, envelope) if old.record else (),
                    aliases=old.aliases,
                    capabilities=capabilities,
                )
            )
            return statement

        return self.store.atomic(txn)

    def apply_revocation(self, signed: SignedRevocation, now_us: int) -> Revocation:
        """End a key at once (a rotated key's grace period too)."""
        revocation = open_revocation(signed, now_us, max_skew_us=self.config.max_skew_us)
        ended = min(revocation.issued_us, now_us)

        def txn(tx: RecordStoreTx) -> Revocation:
            row = tx.get(revocation.agent_id)
            if row is None:
                self._make_room(tx, now_us)
                tx.put(AgentRow(revocation.agent_id, revocation.seq, KeyState.REVOKED, ended_us=ended))
                return revocation
            if revocation.seq <= row.seq:
                raise MessageRejected(
                    f"revocation seq {revocation.seq} is not above the stored {row.seq}", reason="stale_seq"
                )
            if row.state is KeyState.REVOKED:
                raise MessageRejected(f"{row.agent_id[:16]}… is already revoked", reason="key_revoked")
            ended_at = min(row.ended_us, ended) if row.state is KeyState.ROTATED else ended
            # The record and aliases stay (reserved; a rotation to the committed successor
            # can still claim them); capabilities leave the index at once.
            tx.put(
                replace(row, seq=revocation.seq, state=KeyState.REVOKED, ended_us=ended_at, capabilities=())
            )
            return revocation

        return self.store.atomic(txn)

    # --- lookups -------------------------------------------------------------------------------

    def lookup_id(self, agent_id: str, now_us: int) -> RegistryEntry | None:
        """The live entry of ``agent_id``, or None (unknown, expired, rotated or revoked)."""
        check_agent_id(agent_id)
        row = self.store.atomic(lambda tx: tx.get(agent_id), write=False)
        return _entry(row, now_us)

    def lookup_alias(self, alias: str, now_us: int) -> RegistryEntry | None:
        """The live entry holding ``alias``, or None."""
        if not is_alias(alias):
            raise ConfigError(f"not an alias: {alias!r:.80}")

        def txn(tx: RecordStoreTx) -> AgentRow | None:
            owner = tx.alias_owner(alias)
            row = tx.get(owner) if owner is not None else None
            return row if row is not None and alias in row.aliases else None

        return _entry(self.store.atomic(txn, write=False), now_us)

    def lookup_capability(
        self, capability: str, now_us: int, limit: int | None = None
    ) -> list[RegistryEntry]:
        """Live entries offering ``capability``, sorted by AgentId, at most ``limit`` (``max_lookup``)."""
        if not is_capability(capability):
            raise ConfigError(f"not a capability: {capability!r:.80}")
        n = self.config.max_lookup if limit is None else max(0, min(limit, self.config.max_lookup))
        rows = self.store.atomic(lambda tx: tx.with_capability(capability, now_us, n), write=False)
        entries = [e for e in (_entry(r, now_us) for r in rows) if e is not None]
        return sorted(entries, key=lambda e: e.agent_id)

    def key_status(self, agent_id: str, now_us: int) -> KeyInfo:
        check_agent_id(agent_id)
        row = self.store.atomic(lambda tx: tx.get(agent_id), write=False)
        if row is None:
            return KeyInfo(KeyStatus.UNKNOWN)
        if row.state is KeyState.REVOKED:
            status = KeyStatus.REVOKED
        elif row.state is KeyState.ROTATED:
            in_grace = now_us < row.ended_us + self.config.rotation_grace_us
            status = KeyStatus.ROTATING if in_grace else KeyStatus.ROTATED
        else:
            status = KeyStatus.ACTIVE if row.expires_us > now_us else KeyStatus.EXPIRED
        return KeyInfo(status, row.seq, row.successor)

    def is_key_valid(self, agent_id: str, now_us: int) -> bool:
        """True for a registered key with a live record, or a rotated key inside its grace period.

        A node that does not require registration should refuse only ended keys:
        ``key_status(...).status in (KeyStatus.ROTATED, KeyStatus.REVOKED)``.
        """
        if not is_agent_id(agent_id):
            return False
        return self.key_status(agent_id, now_us).status in (KeyStatus.ACTIVE, KeyStatus.ROTATING)

    # --- housekeeping --------------------------------------------------------------------------

    def purge(self, now_us: int, limit: int = 1000) -> int:
        """Drop records that expired more than ``hold_us`` ago (their aliases are freed).

        The row of an active key goes; a rotated or revoked key keeps its row (its
        ``seq`` and state) for good. Returns how many records were dropped.
        """
        return self.store.atomic(lambda tx: self._purge(tx, now_us, limit))

    def count(self) -> int:
        """How many keys the store holds (including rotated and revoked ones)."""
        return self.store.atomic(lambda tx: tx.count(), write=False)

    def _purge(self, tx: RecordStoreTx, now_us: int, limit: int) -> int:
        rows = tx.purgeable(now_us - self.config.hold_us, limit)
        for row in rows:
            if row.state is KeyState.ACTIVE:
                tx.delete(row.agent_id)
            else:
                tx.put(
                    replace(
                        row, expires_us=0, record=b"", signature=b"", proof=(), aliases=(), capabilities=()
                    )
                )
        return len(rows)

    def _make_room(self, tx: RecordStoreTx, now_us: int, evicted: list[str] | None = None) -> None:
        """Room for one more key: purge; else evict a relayed record into ``evicted`` if given."""
        if tx.count() < self.config.max_keys:
            return
        self._purge(tx, now_us, 16)
        if tx.count() < self.config.max_keys:
            return
        victim = self._neighbours.victim(tx) if evicted is not None else None
        if victim is None or evicted is None:
            raise MessageRejected(f"the registry holds {self.config.max_keys} keys", reason="registry_full")
        tx.delete(victim)
        evicted.append(victim)


def _refuse_ended(row: AgentRow) -> None:
    if row.state is KeyState.REVOKED:
        raise MessageRejected(f"{row.agent_id[:16]}… is revoked", reason="key_revoked")
    if row.state is KeyState.ROTATED:
        raise MessageRejected(
            f"{row.agent_id[:16]}… was rotated to {row.successor[:16]}…", reason="key_rotated"
        )


def _entry(row: AgentRow | None, now_us: int) -> RegistryEntry | None:
    if row is None or row.state is not KeyState.ACTIVE or not row.record or row.expires_us <= now_us:
        return None
    base = decode_record(row.record)
    rotations = tuple(_rotation_from_envelope(p) for p in row.proof)
    if rotations:
        record = replace(base, agent_id=row.agent_id, seq=row.seq, next_key_digest=None, aliases=row.aliases)
    else:
        record = replace(base, aliases=row.aliases)
    return RegistryEntry(record, SignedRecord(row.record, row.signature), rotations)
