"""The HELLO nonce cache: every nonce a server accepted, for as long as its HELLO is fresh. Sans-IO.

docs/PROTOCOL.md, "Nonce cache": a server remembers the nonce of every client
HELLO it accepted for ``2 × max_skew`` (a HELLO is fresh while
``|now − timestamp| ≤ max_skew``, so a replay after that is stale anyway). A nonce
is recorded only once the HELLO verified *and* was admitted, so a key the
admission policy refuses cannot fill the cache.

* :class:`NonceStore` is the interface: one atomic check-and-set with expiry.
  ``shared`` says whether several processes or hosts can use the same store
  (servers of a 0-RTT cluster must: docs/PROTOCOL.md, "0-RTT and tickets").
* :class:`NonceCache` is the in-memory store (one per node, shared by all its
  listeners); :mod:`iac.stores.nonces` has SQLite and Redis ones.
"""

from __future__ import annotations

import heapq
from typing import Protocol, runtime_checkable

from iac.errors import ConfigError, HandshakeError

DEFAULT_MAX_SKEW_US = 60_000_000
#: Nonces remembered at most (the cache refuses new HELLOs rather than forget early).
DEFAULT_NONCE_CACHE_SIZE = 100_000


@runtime_checkable
class NonceStore(Protocol):
    """Where accepted HELLO nonces are kept (in memory, SQLite or Redis)."""

    @property
    def shared(self) -> bool:
        """True if other processes or hosts can see the same nonces (SQLite, Redis)."""
        ...

    def check_and_add(self, nonce: bytes, now_us: int, *, max_skew_us: int | None = None) -> None:
        """Record ``nonce`` until ``now_us + 2 × max_skew``, atomically.

        Raises ``replayed_hello`` if it is already recorded, and
        :class:`~iac.errors.HandshakeError` (``busy``) when the store is full of
        unexpired nonces. ``max_skew_us``: the handshake's skew (the store keeps a
        nonce for twice the larger of it and its own ``max_skew_us``).
        """
        ...


def nonce_busy(limit: int) -> HandshakeError:
    """The refusal of a full nonce store."""
    return HandshakeError(f"busy: too many recent handshakes (nonce cache full: {limit} nonces)")


class NonceCache:
    """HELLO nonces seen within the freshness window, in memory; bounded.

    A nonce is kept for ``2 × max_skew`` after it was recorded. When the cache is
    full of unexpired nonces it refuses new HELLOs (:class:`HandshakeError`)
    rather than forget one early, which would reopen a replay. Give every
    listener of a node the same cache (``TransportConfig.nonce_cache``), so that
    a HELLO accepted on one transport is a replay on another.
    """

    shared = False

    def __init__(
        self, max_skew_us: int = DEFAULT_MAX_SKEW_US, max_entries: int = DEFAULT_NONCE_CACHE_SIZE
    ) -> None:
        if max_skew_us <= 0 or max_entries < 1:
            raise ConfigError("NonceCache needs a positive max_skew_us and max_entries")
        self.max_skew_us = max_skew_us
        self.max_entries = max_entries
        self._seen: dict[bytes, int] = {}  # nonce -> expiry (us)
        self._expiry: list[tuple[int, bytes]] = []  # a heap of (expiry, nonce)

    def __len__(self) -> int:
        return len(self._seen)

    def __contains__(self, nonce: object) -> bool:
        return nonce in self._seen

    def expire(self, now_us: int) -> None:
        heap = self._expiry
        while heap and heap[0][0] <= now_us:
            _at, nonce = heapq.heappop(heap)
            self._seen.pop(nonce, None)

    def check_and_add(self, nonce: bytes, now_us: int, *, max_skew_us: int | None = None) -> None:
        """Record ``nonce``; ``replayed_hello`` if it was seen within the window."""
        self.expire(now_us)
        if nonce in self._seen:
            raise HandshakeError(
                "HELLO nonce was already used within the freshness window", reason="replayed_hello"
            )
        if len(self._seen) >= self.max_entries:
            raise nonce_busy(self.max_entries)
        skew = self.max_skew_us if max_skew_us is None else max(self.max_skew_us, max_skew_us)
        expiry = now_us + 2 * skew
        self._seen[nonce] = expiry
        heapq.heappush(self._expiry, (expiry, nonce))


__all__ = ["DEFAULT_NONCE_CACHE_SIZE", "NonceCache", "NonceStore", "nonce_busy"]
