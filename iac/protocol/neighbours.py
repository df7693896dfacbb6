"""The registry's view of its neighbours, sans-IO: how many new keys each brought in by FORWARD
(a token bucket per neighbour) and which, so that a direct publish into a full registry can evict
one of them (:class:`~iac.protocol.registry.RegistryState`, "Neighbours").

A neighbour is the key whose HELLO proved the connection a relayed publish came on. What is kept
is this process's view since it started: at most ``max_keys`` keys per neighbour, and the
buckets of at most ``max_keys`` neighbours (full ones are forgotten first).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from iac.errors import MessageRejected
from iac.protocol.record_store import KeyState, RecordStoreTx


@dataclass
class RegistryStats:
    """What a :class:`RegistryState` refused or evicted for the neighbour bounds."""

    #: publishes of new keys refused: their neighbour's quota was spent (``registry_quota``)
    quota_refused: int = 0
    #: records a direct publish evicted (brought in through the neighbour that brought in most)
    evicted: int = 0
    #: new keys each neighbour brought in (relayed) by this state, still tracked
    brought_in: dict[str, int] = field(default_factory=dict)


@dataclass
class _Bucket:
    tokens: float
    at_us: int


class Neighbours:
    """Quotas of new keys per neighbour, and the keys each brought in (oldest first)."""

    def __init__(self, quota: int, period_us: int, max_keys: int) -> None:
        self.quota = quota
        self.period_us = period_us
        self.max_keys = max_keys
        self.stats = RegistryStats()
        #: neighbour -> the new keys it brought in, oldest first (eviction candidates)
        self._brought: dict[str, OrderedDict[str, None]] = {}
        #: neighbour -> its quota of new keys (a token bucket)
        self._quota: dict[str, _Bucket] = {}
        #: held around a publish (whose store may run in a worker thread): check, then spend
        self.lock = threading.Lock()

    def check(self, via: str | None, now_us: int) -> None:
        """Raise ``registry_quota`` if ``via`` (None: a direct publish) spent its quota."""
        if via is not None and self.tokens(via, now_us) < 1:
            raise MessageRejected(
                f"neighbour {via[:16]}… brought in {self.quota} new keys within "
                f"{self.period_us // 1_000_000} s (forwarded_keys); publish directly",
                reason="registry_quota",
            )

    def run(
        self, publish: Callable[[], bool], via: str | None, agent_id: str, evicted: Sequence[str], now_us: int
    ) -> None:
        """Run ``publish`` (the store transaction: True when ``agent_id`` is a new key), one at a
        time, so that a quota is checked and spent in one step; then count what it did: the
        keys ``evicted`` to make room are gone, a new key relayed by ``via`` is brought in."""
        with self.lock:
            try:
                new = publish()
            except MessageRejected as exc:
                if exc.reason == "registry_quota":
                    self.stats.quota_refused += 1
                raise
            for victim in evicted:
                self.forget(victim)
                self.stats.evicted += 1
            if new and via is not None:
                self.bring(via, agent_id, now_us)

    def tokens(self, via: str, now_us: int) -> float:
        """How many new keys ``via`` may bring in now."""
        bucket = self._quota.get(via)
        if bucket is None:
            return float(self.quota)
        rate = self.quota / self.period_us
        return min(float(self.quota), bucket.tokens + max(0, now_us - bucket.at_us) * rate)

    def bring(self, via: str, agent_id: str, now_us: int) -> None:
        """``via`` brought in the new key ``agent_id``: one of its quota spent."""
        tokens = self.tokens(via, now_us) - 1
        self._quota[via] = _Bucket(tokens, now_us)
        if len(self._quota) > self.max_keys:  # neighbours whose bucket is full again: forgotten
            for v in [v for v in self._quota if self.tokens(v, now_us) >= self.quota]:
                del self._quota[v]
        keys = self._brought.setdefault(via, OrderedDict())
        keys[agent_id] = None
        if len(keys) > self.max_keys:
            keys.popitem(last=False)
        self.stats.brought_in[via] = len(keys)

    def forget(self, agent_id: str) -> None:
        """``agent_id`` left the registry (evicted)."""
        for via, keys in list(self._brought.items()):
            if agent_id in keys:
                del keys[agent_id]
                self.stats.brought_in[via] = len(keys)
            if not keys:
                del self._brought[via]
                self.stats.brought_in.pop(via, None)

    def victim(self, tx: RecordStoreTx) -> str | None:
        """The oldest active record brought in through the neighbour that brought in the most."""
        for via in sorted(self._brought, key=lambda v: len(self._brought[v]), reverse=True):
            keys = self._brought[via]
            gone: list[str] = []  # purged, rotated or revoked since: no longer candidates
            found = None
            for agent_id in keys:
                row = tx.get(agent_id)
                if row is not None and row.state is KeyState.ACTIVE:
                    found = agent_id
                    break
                gone.append(agent_id)
            for agent_id in gone:
                del keys[agent_id]
            self.stats.brought_in[via] = len(keys)
            if found is not None:
                return found
        return None


__all__ = ["Neighbours", "RegistryStats"]
