"""What a discovery client verified, and the admission checks built on it.

:class:`KeyBook` is a client's verified cache (records, rotations, revocations);
:func:`registry_admission` and :meth:`KeyBook.guard` turn a registry state or a key book into
the node's HELLO admission policy and a content guard that refuses ended keys;
:func:`move_peer` hands a rotated key's addresses to its successor.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from iac.errors import ConfigError, IacError, MessageRejected
from iac.node.node import Node
from iac.protocol.clock import SYSTEM_CLOCK, Clock
from iac.protocol.records import (
    AgentRecord,
    Revocation,
    RotationStatement,
    SignedRevocation,
    SignedRotation,
    decode_rotation,
    open_revocation,
    open_rotation,
)
from iac.protocol.registry import KeyStatus, RegistryConfig, RegistryEntry, RegistryState, verify_entry
from iac.wire._pb.iac_pb2 import Message
from iac.wire.identity import check_agent_id
from iac.wire.message import sender_of

log = logging.getLogger("iac.mesh")


@dataclass(frozen=True, slots=True)
class _Ended:
    successor: str  # "" for a revocation
    ended_us: int


class KeyBook:
    """What a client verified: records (from registry lookups), rotations and revocations.

    Bounded (``max_records``; the soonest to expire goes first). ``rotation_grace_us`` is how
    long a rotated key is still accepted (the registry's default).
    """

    def __init__(self, *, rotation_grace_us: int | None = None, max_records: int = 10_000) -> None:
        if max_records < 1:
            raise ConfigError("max_records must be at least 1")
        self.rotation_grace_us = (
            RegistryConfig().rotation_grace_us if rotation_grace_us is None else rotation_grace_us
        )
        self.max_records = max_records
        self._records: dict[str, AgentRecord] = {}
        self._ended: dict[str, _Ended] = {}
        self._max_ended = 4 * max_records

    def add(self, entry: RegistryEntry, now_us: int) -> AgentRecord:
        """Verify a lookup result (:func:`verify_entry`) and keep it."""
        record = verify_entry(entry, now_us)
        if record.agent_id in self._ended and self._ended[record.agent_id].successor == "":
            raise MessageRejected(f"{record.agent_id[:16]}… is revoked", reason="bad_record")
        for rot in entry.rotations:  # the proof says these keys handed over
            st = decode_rotation(rot.data)
            self._end(st.old_agent_id, _Ended(st.new_agent_id, min(st.issued_us, now_us)))
        self._put(record, now_us)
        return record

    def _put(self, record: AgentRecord, now_us: int) -> None:
        old = self._records.get(record.agent_id)
        if old is not None and old.seq > record.seq:
            return
        self._records[record.agent_id] = record
        if len(self._records) > self.max_records:
            for aid in sorted(self._records, key=lambda a: self._records[a].expires_us)[
                : len(self._records) - self.max_records
            ]:
                del self._records[aid]

    def _end(self, agent_id: str, ended: _Ended) -> None:
        prev = self._ended.get(agent_id)
        if prev is not None and (prev.successor == "" or prev.ended_us <= ended.ended_us):
            return
        self._ended[agent_id] = ended
        if len(self._ended) > self._max_ended:
            self._ended.pop(next(iter(self._ended)))

    def get(self, agent_id: str, now_us: int) -> AgentRecord | None:
        """The unexpired record of a key that has not ended, or None."""
        rec = self._records.get(agent_id)
        if rec is None or rec.expires_us <= now_us or self.status(agent_id, now_us) is not KeyStatus.ACTIVE:
            return None
        return rec

    def alias(self, alias: str, now_us: int) -> str | None:
        for aid, rec in self._records.items():
            if alias in rec.aliases and self.get(aid, now_us) is not None:
                return aid
        return None

    def with_capability(self, capability: str, now_us: int) -> list[str]:
        return sorted(
            aid for aid, r in self._records.items() if capability in r.capabilities and self.get(aid, now_us)
        )

    def successor(self, agent_id: str) -> str:
        """The key ``agent_id`` rotated to (following the chain), or ``""``."""
        seen: set[str] = set()
        current = agent_id
        while current in self._ended and self._ended[current].successor and current not in seen:
            seen.add(current)
            current = self._ended[current].successor
        return "" if current == agent_id else current

    def note_rotation(self, signed: SignedRotation, now_us: int) -> RotationStatement:
        """Verify a rotation statement (against the old key's committed successor when its record
        is known) and remember it: the old key's record moves to the successor."""
        st = decode_rotation(signed.data)
        old = self._records.get(st.old_agent_id)
        st = open_rotation(signed, now_us, next_key_digest=old.next_key_digest if old else None)
        prev = self._ended.get(st.old_agent_id)
        if prev is not None and prev.successor != st.new_agent_id and prev.successor:
            raise MessageRejected(
                f"{st.old_agent_id[:16]}… already rotated to another key", reason="bad_record"
            )
        if old is not None and st.seq <= old.seq:
            raise MessageRejected(
                f"rotation seq {st.seq} is not above the record's {old.seq}", reason="bad_record"
            )
        self._end(st.old_agent_id, _Ended(st.new_agent_id, min(st.issued_us, now_us)))
        if old is not None and st.new_agent_id not in self._records:
            self._records[st.new_agent_id] = replace(
                old, agent_id=st.new_agent_id, seq=st.seq, next_key_digest=None
            )
        return st

    def note_revocation(self, signed: SignedRevocation, now_us: int) -> Revocation:
        """Verify a revocation and remember it: the key is refused at once."""
        rev = open_revocation(signed, now_us)
        self._ended[rev.agent_id] = _Ended("", min(rev.issued_us, now_us))
        self._records.pop(rev.agent_id, None)
        return rev

    def status(self, agent_id: str, now_us: int) -> KeyStatus:
        ended = self._ended.get(agent_id)
        if ended is not None:
            if not ended.successor:
                return KeyStatus.REVOKED
            in_grace = now_us < ended.ended_us + self.rotation_grace_us
            return KeyStatus.ROTATING if in_grace else KeyStatus.ROTATED
        rec = self._records.get(agent_id)
        if rec is None:
            return KeyStatus.UNKNOWN
        return KeyStatus.ACTIVE if rec.expires_us > now_us else KeyStatus.EXPIRED

    def is_ended(self, agent_id: str, now_us: int) -> bool:
        return self.status(agent_id, now_us) in (KeyStatus.ROTATED, KeyStatus.REVOKED)

    def guard(self, clock: Clock | None = None) -> Callable[[Message, Any], str | None]:
        """A content guard (``NodeConfig.guards``) refusing messages from rotated (after the grace
        period) and revoked keys."""
        clk = clock if clock is not None else SYSTEM_CLOCK

        def ended_key_guard(msg: Message, payload: Any) -> str | None:
            sender = sender_of(msg)
            status = self.status(sender, clk.now_us())
            if status in (KeyStatus.ROTATED, KeyStatus.REVOKED):
                return f"the sender's key is {status.value}"
            return None

        return ended_key_guard


def registry_admission(
    source: RegistryState | KeyBook,
    clock: Clock | None = None,
    *,
    require_registered: bool = True,
    allow: Iterable[str] = (),
) -> Callable[[str], bool]:
    """An admission policy (``TransportConfig.admission``) for a node co-located with a registry
    state (same SQLite file or Redis server) or holding a client :class:`KeyBook`.

    With ``require_registered`` a dialing peer is admitted only while its key is registered
    with a live record (or is a rotated key inside its grace period); without it, only
    rotated (past the grace period) and revoked keys are refused. ``allow`` lists AgentIds
    admitted regardless (the registry, operators). A store that fails refuses (fail closed).
    The check runs in the HELLO exchange, on the event loop: a Redis round trip per dial.
    """
    clk = clock if clock is not None else SYSTEM_CLOCK
    allowed = frozenset(check_agent_id(a) for a in allow)
    good = {KeyStatus.ACTIVE, KeyStatus.ROTATING}
    if not require_registered:
        good |= {KeyStatus.UNKNOWN, KeyStatus.EXPIRED}

    def admit(agent_id: str) -> bool:
        if agent_id in allowed:
            return True
        try:
            if isinstance(source, KeyBook):
                status = source.status(agent_id, clk.now_us())
            else:
                status = source.key_status(agent_id, clk.now_us()).status
        except IacError as exc:
            log.warning("admission: cannot check %s…: %s", agent_id[:16], exc)
            return False
        return status in good

    return admit


def move_peer(node: Node, old: str, new: str) -> None:
    """Give the successor ``new`` the peer-book addresses of ``old`` (after a verified rotation).

    What remains for the node (no public API for it yet): dropping ``old`` from the peer book
    and closing its connections once the grace period ends. Until then, refuse the old key with
    :meth:`KeyBook.guard` (messages) and :func:`registry_admission` (new connections).
    """
    urls = node.peer_book.get(old, [])
    if urls:
        node.add_peer(new, *urls)


__all__ = ["KeyBook", "move_peer", "registry_admission"]
