"""Where a registry keeps its rows: the store interface, and the in-memory store.

:class:`~iac.protocol.registry.RegistryState` makes its decisions inside one
:meth:`RecordStore.atomic` transaction, over :class:`AgentRow` rows and two
indexes (alias -> key, capability -> keys). :class:`MemoryRecordStore` is the
default store and the reference for the others; the SQLite and Redis stores,
shared by several processes or hosts, are in :mod:`iac.stores`.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Protocol, TypeVar

_T = TypeVar("_T")


class KeyState(StrEnum):
    """What the registry knows of a key (stored)."""

    ACTIVE = "active"
    ROTATED = "rotated"
    REVOKED = "revoked"


@dataclass(frozen=True, slots=True)
class AgentRow:
    """One key as a store keeps it.

    ``record``/``signature`` is the signed record the entry comes from: the key's
    own, or after rotations the first key's, with ``proof`` the rotation
    envelopes (canonical JSON) from that key to this one. ``aliases`` and
    ``capabilities`` are what this key holds in the indexes. ``expires_us`` is 0
    when the row holds no record.
    """

    agent_id: str
    seq: int
    state: KeyState = KeyState.ACTIVE
    successor: str = ""
    ended_us: int = 0
    next_key_digest: str = ""
    expires_us: int = 0
    record: bytes = b""
    signature: bytes = b""
    proof: tuple[bytes, ...] = ()
    aliases: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()


class RecordStoreTx(Protocol):
    """Reads and writes inside one atomic store transaction.

    :meth:`put` and :meth:`delete` keep the alias and capability indexes in step
    with the rows: an alias listed in the new row is bound to its key (replacing
    any binding), an alias the row no longer lists is unbound if it was bound to
    this key; a capability is indexed for a row while the row lists it.
    """

    def get(self, agent_id: str) -> AgentRow | None: ...

    def alias_owner(self, alias: str) -> str | None: ...

    def with_capability(self, capability: str, now_us: int, limit: int) -> list[AgentRow]:
        """Rows indexed under ``capability`` with ``expires_us > now_us``, at most ``limit``."""
        ...

    def count(self) -> int: ...

    def purgeable(self, before_us: int, limit: int) -> list[AgentRow]:
        """Rows holding a record with ``0 < expires_us < before_us``, at most ``limit``."""
        ...

    def put(self, row: AgentRow) -> None: ...

    def delete(self, agent_id: str) -> None: ...


class RecordStore(Protocol):
    """Where a registry keeps its rows; :meth:`atomic` runs one transaction."""

    def atomic(self, fn: Callable[[RecordStoreTx], _T], *, write: bool = True) -> _T:
        """Run ``fn`` in one transaction; commit its writes if it returns, discard them if it raises.

        A store may call ``fn`` more than once (optimistic concurrency), so ``fn``
        must not have side effects outside the transaction.
        """
        ...

    def close(self) -> None: ...


def index_changes(
    old: AgentRow | None, new: AgentRow | None
) -> tuple[set[str], set[str], set[str], set[str]]:
    """(aliases unbound, aliases bound, capabilities removed, capabilities added)."""
    old_a = set(old.aliases) if old else set()
    new_a = set(new.aliases) if new else set()
    old_c = set(old.capabilities) if old else set()
    new_c = set(new.capabilities) if new else set()
    return old_a - new_a, new_a, old_c - new_c, new_c


class MemoryRecordStore:
    """Rows in dictionaries; one lock; writes undone if the transaction raises."""

    def __init__(self) -> None:
        self._rows: dict[str, AgentRow] = {}
        self._aliases: dict[str, str] = {}
        #: capability -> the key offering it, or a set once several do (one key: no set, so a
        #: record's own capabilities cost a dictionary entry each, not a set each).
        self._caps: dict[str, str | set[str]] = {}
        self._lock = threading.RLock()

    def atomic(self, fn: Callable[[RecordStoreTx], _T], *, write: bool = True) -> _T:
        with self._lock:
            tx = _MemoryTx(self)
            try:
                return fn(tx)
            except BaseException:
                tx.rollback()
                raise

    def close(self) -> None:
        pass

    def _apply(self, agent_id: str, old: AgentRow | None, new: AgentRow | None) -> None:
        unbind, bind, cap_rm, cap_add = index_changes(old, new)
        for alias in unbind:
            if self._aliases.get(alias) == agent_id:
                del self._aliases[alias]
        for alias in bind:
            self._aliases[alias] = agent_id
        caps = self._caps
        for cap in cap_rm:
            ids = caps.get(cap)
            if ids == agent_id:
                del caps[cap]
            elif isinstance(ids, set):
                ids.discard(agent_id)
                if len(ids) == 1:
                    caps[cap] = ids.pop()
        for cap in cap_add:
            ids = caps.get(cap)
            if ids is None:
                caps[cap] = agent_id
            elif isinstance(ids, set):
                ids.add(agent_id)
            elif ids != agent_id:
                caps[cap] = {ids, agent_id}
        if new is None:
            self._rows.pop(agent_id, None)
        elif new.capabilities:
            # a name several keys offer is kept once for all of them, not once per record
            named = tuple(sys.intern(c) if isinstance(caps.get(c), set) else c for c in new.capabilities)
            self._rows[agent_id] = replace(new, capabilities=named)
        else:
            self._rows[agent_id] = new


class _MemoryTx:
    def __init__(self, store: MemoryRecordStore) -> None:
        self._s = store
        self._undo: list[tuple[str, AgentRow | None, AgentRow | None]] = []

    def get(self, agent_id: str) -> AgentRow | None:
        return self._s._rows.get(agent_id)

    def alias_owner(self, alias: str) -> str | None:
        return self._s._aliases.get(alias)

    def with_capability(self, capability: str, now_us: int, limit: int) -> list[AgentRow]:
        out: list[AgentRow] = []
        ids = self._s._caps.get(capability, ())
        for agent_id in sorted((ids,) if isinstance(ids, str) else ids):
            row = self._s._rows.get(agent_id)
            if row is not None and row.expires_us > now_us:
                out.append(row)
                if len(out) >= limit:
                    break
        return out

    def count(self) -> int:
        return len(self._s._rows)

    def purgeable(self, before_us: int, limit: int) -> list[AgentRow]:
        rows = [r for r in self._s._rows.values() if 0 < r.expires_us < before_us]
        rows.sort(key=lambda r: r.expires_us)
        return rows[:limit]

    def put(self, row: AgentRow) -> None:
        old = self._s._rows.get(row.agent_id)
        self._undo.append((row.agent_id, old, row))
        self._s._apply(row.agent_id, old, row)

    def delete(self, agent_id: str) -> None:
        old = self._s._rows.get(agent_id)
        if old is not None:
            self._undo.append((agent_id, old, None))
            self._s._apply(agent_id, old, None)

    def rollback(self) -> None:
        while self._undo:
            agent_id, old, new = self._undo.pop()
            self._s._apply(agent_id, new, old)
