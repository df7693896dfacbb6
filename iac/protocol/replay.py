"""Anti-replay: freshness and a per-session sliding window of msg_ids. Sans-IO.

Nothing here reads a clock: every call takes ``now_us`` (microseconds since the
Unix epoch, the receiver's clock) and the message's ``timestamp_us``.

A message is accepted once per ``(from, session_id, msg_id)``:

* **Freshness** (:func:`check_freshness`): ``|now - timestamp| <= max_skew``,
  and a store without history (in-memory) also refuses a timestamp older than
  its own start. Failing either raises ``stale_message``.
* **Window** (every :class:`ReplayStore`; the in-memory one is
  :class:`~iac.stores.memory.MemoryReplayStore`): per session, the highest msg_id seen
  and a bitmap of the ``window_size`` ids ending at it (bit ``i`` is id
  ``highest - i``). An id ``window_size`` or more behind the highest is
  :attr:`Verdict.TOO_OLD`; an id in the window that is already marked is
  :attr:`Verdict.DUPLICATE`. Ids compare with RFC 1982 serial-number
  arithmetic on 64 bits, so the counter may wrap.
* **Expiry**: a session's window is kept for ``2 * max_skew`` after the arrival
  (receiver clock) of its newest message. A replay arriving later carries a
  timestamp at least ``max_skew`` old and is refused by freshness, so dropping
  the window re-opens nothing. Memory is bounded by active senders, with a hard
  cap (``max_sessions``): when it is reached and nothing has expired, a *new*
  session is refused with ``replay_store_full``; live windows are never
  evicted, because evicting one would re-open its replays. So that one tenant
  cannot fill the cap, one sender, and one neighbour (the key whose HELLO
  proved the connection a message came on: a relay's FORWARDs count toward it),
  may hold at most ``ReplayConfig.tenant_sessions`` windows (1 % of
  ``max_sessions`` by default); a new session beyond that share is refused
  with ``replay_store_full`` while other tenants' sessions are admitted.

Check-and-set is one atomic call, either single-phase (:meth:`~ReplayStore.check_and_mark`)
or two-phase (:meth:`~ReplayStore.reserve`, then :meth:`~ReplayStore.commit` once the
handler accepted the message, or :meth:`~ReplayStore.release` if it failed, so that a
retransmission can be handled). While an id is reserved, a duplicate gets
:attr:`Verdict.IN_PROGRESS`.

* **Lease** (stores that other processes share): a reservation lasts
  :attr:`~ReplayStore.reservation_lease_us` (default
  :data:`DEFAULT_RESERVATION_LEASE_US`, 5 s) unless its holder renews it
  (:meth:`~ReplayStore.renew`; a node does so every third of the lease while it
  holds the id), so the reservation of a process that died lapses within a
  lease and the sender's retransmission is handled. The in-memory store dies
  with its holder: its reservations never lapse.
* **Frontier** (:meth:`~ReplayStore.frontier`): the highest id of a session
  that is done or reserved by another holder, which is where a node that has no
  reorder buffer for the session (it restarted) goes on from. A reserved id
  counts because its holder may have answered it already (a process killed
  between its ACK and its commit): its sender then never sends it again.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol, runtime_checkable

from iac.errors import ConfigError, MessageRejected

SERIAL_BITS = 64
_MOD = 1 << SERIAL_BITS
_HALF = 1 << (SERIAL_BITS - 1)
_MASK64 = _MOD - 1

#: Smallest window allowed (IPsec/DTLS anti-replay use at least this order).
MIN_WINDOW_SIZE = 1024
DEFAULT_WINDOW_SIZE = 1024
DEFAULT_MAX_SKEW_US = 60_000_000
DEFAULT_MAX_SESSIONS = 100_000
#: One tenant's share of ``max_sessions`` by default (per sender and per neighbour), in percent.
DEFAULT_TENANT_SHARE_PERCENT = 1
#: How long a reservation in a shared store lasts unless its holder renews it.
DEFAULT_RESERVATION_LEASE_US = 5_000_000


def serial_diff(a: int, b: int) -> int:
    """Signed distance ``a - b`` between two 64-bit serial numbers (RFC 1982).

    The result is in ``[-2**63, 2**63)``. RFC 1982 leaves a distance of exactly
    ``2**63`` undefined; this function calls it ``-2**63`` (``a`` is older), so
    such an id is treated as too old rather than as new.
    """
    d = (a - b) & _MASK64
    return d - _MOD if d >= _HALF else d


def highest_of(top: int, window_size: int, done: int, reserved: Collection[int]) -> int | None:
    """The highest of a window's done ids (bitmap ``done``: bit ``i`` is id ``top - i``) and the
    ``reserved`` ids inside it; None if there is none."""
    best = (done & -done).bit_length() - 1 if done else window_size
    for r in reserved:
        back = serial_diff(top, r)
        if 0 <= back < best:
            best = back
    return (top - best) & _MASK64 if best < window_size else None


def serial_add(a: int, n: int) -> int:
    """``a + n`` modulo ``2**64``."""
    return (a + n) & _MASK64


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """Limits for freshness and the replay window.

    Attributes:
        window_size: ``N``, how many ids below the highest are remembered per
            session (default 1024, at least 1024). A sender must keep fewer than
            ``N`` messages unacknowledged per session.
        max_skew_us: how far a timestamp may be from the receiver's clock, either
            way (default 60 s). Windows are kept ``2 * max_skew_us``.
        max_sessions: hard cap on tracked ``(from, session_id)`` windows
            (default 100 000). Each window costs roughly ``N / 8`` bytes plus
            overhead (about 200 bytes at ``N = 1024``).
        sessions_per_tenant: the share of one tenant: at most this many live
            windows per sender, and per neighbour that delivered them (the
            ``via`` of :meth:`ReplayStore.reserve`: the key whose HELLO proved the
            connection, so a relay's FORWARDs count toward it). None (default):
            1 % of ``max_sessions`` (:data:`DEFAULT_TENANT_SHARE_PERCENT`), at least 1.
            A tenant over its share gets ``replay_store_full``
            for a new session of its own while others' are admitted.
    """

    window_size: int = DEFAULT_WINDOW_SIZE
    max_skew_us: int = DEFAULT_MAX_SKEW_US
    max_sessions: int = DEFAULT_MAX_SESSIONS
    sessions_per_tenant: int | None = None

    def __post_init__(self) -> None:
        if self.window_size < MIN_WINDOW_SIZE:
            raise ConfigError(f"window_size must be at least {MIN_WINDOW_SIZE}, got {self.window_size}")
        if self.max_skew_us <= 0:
            raise ConfigError(f"max_skew_us must be positive, got {self.max_skew_us}")
        if self.max_sessions < 1:
            raise ConfigError(f"max_sessions must be at least 1, got {self.max_sessions}")
        if self.sessions_per_tenant is not None and not 1 <= self.sessions_per_tenant <= self.max_sessions:
            raise ConfigError(
                f"sessions_per_tenant must be in 1 .. max_sessions, got {self.sessions_per_tenant}"
            )

    @property
    def tenant_sessions(self) -> int:
        """The most live windows one sender, or one neighbour (``via``), may hold."""
        if self.sessions_per_tenant is not None:
            return self.sessions_per_tenant
        return max(1, self.max_sessions * DEFAULT_TENANT_SHARE_PERCENT // 100)

    @property
    def retention_us(self) -> int:
        """How long a session's window outlives its newest message: ``2 * max_skew_us``."""
        return 2 * self.max_skew_us


class Verdict(Enum):
    """What a replay store says about one ``(from, session_id, msg_id)``."""

    #: Not seen before; now marked (check_and_mark) or reserved (reserve).
    NEW = "new"
    #: Already accepted (committed): answer again (ACK / cached REPLY), do not handle twice.
    DUPLICATE = "duplicate"
    #: Reserved by a handler that has not finished: wait for it.
    IN_PROGRESS = "in_progress"
    #: At least ``window_size`` behind the session's highest id: cannot be told apart, refused.
    TOO_OLD = "too_old"


def check_freshness(
    timestamp_us: int, now_us: int, max_skew_us: int, history_start_us: int | None = None
) -> None:
    """Raise ``stale_message`` unless the timestamp is fresh.

    Fresh means ``|now_us - timestamp_us| <= max_skew_us`` and, for a store
    without history (``history_start_us`` is not None), ``timestamp_us >=
    history_start_us``.
    """
    if timestamp_us < now_us - max_skew_us:
        raise MessageRejected(
            f"timestamp {timestamp_us} is {now_us - timestamp_us} us in the past (max_skew {max_skew_us} us)",
            reason="stale_message",
        )
    if timestamp_us > now_us + max_skew_us:
        raise MessageRejected(
            f"timestamp {timestamp_us} is {timestamp_us - now_us} us in the future "
            f"(max_skew {max_skew_us} us)",
            reason="stale_message",
        )
    if history_start_us is not None and timestamp_us < history_start_us:
        raise MessageRejected(
            f"timestamp {timestamp_us} is before the replay store started ({history_start_us}); "
            "it has no history to check it against",
            reason="stale_message",
        )


@runtime_checkable
class ReplayStore(Protocol):
    """Where replay windows live: in memory, SQLite (survives a restart) or Redis (shared).

    Every method is one atomic step for its key ``(sender, session_id)``. The
    store does not check timestamps (:class:`ReplayGuard` does); it expires a
    window ``2 * max_skew_us`` after its newest arrival (``now_us``), e.g. a
    Redis key with that TTL, refreshed on every call.
    """

    @property
    def max_skew_us(self) -> int:
        """The skew that freshness uses; the store keeps windows twice as long."""
        ...

    @property
    def history_start_us(self) -> int | None:
        """None if the store remembers everything still fresh; else when its memory begins."""
        ...

    def check_and_mark(
        self, sender: str, session_id: int, msg_id: int, now_us: int, *, via: str | None = None
    ) -> Verdict:
        """Single phase: if the id is new, mark it done and return NEW.

        A new session counts toward the share of ``sender`` and of ``via`` (the neighbour that
        delivered the message; None: the sender itself): over either,
        ``replay_store_full`` (``ReplayConfig.tenant_sessions``).
        """
        ...

    def reserve(
        self, sender: str, session_id: int, msg_id: int, now_us: int, *, via: str | None = None
    ) -> Verdict:
        """Two phase, step one: if the id is new, reserve it and return NEW.

        A duplicate of a reserved id gets IN_PROGRESS until :meth:`commit` or :meth:`release`.
        A new session counts toward the shares of ``sender`` and ``via``, as in
        :meth:`check_and_mark`.
        """
        ...

    def commit(self, sender: str, session_id: int, msg_id: int, now_us: int) -> None:
        """Mark a reserved id done: from now on it is a DUPLICATE."""
        ...

    def release(self, sender: str, session_id: int, msg_id: int, now_us: int) -> None:
        """Drop a reservation (the handler failed) so a retransmission is NEW again."""
        ...

    def expire(self, now_us: int) -> int:
        """Drop windows whose retention has passed; return how many were dropped."""
        ...

    @property
    def reservation_lease_us(self) -> int | None:
        """How long a reservation lasts unless renewed; None if it never lapses (a store of one
        process, which dies with the holder)."""
        ...

    def renew(self, keys: Sequence[tuple[str, int, int]], now_us: int) -> int:
        """Extend each reservation ``(sender, session_id, msg_id)`` that has not lapsed to a lease
        from ``now_us``; return how many were extended. A lapsed, committed, released or unknown
        id is left as it is (never reserved again by this call)."""
        ...

    def frontier(
        self, sender: str, session_id: int, now_us: int, exclude: Collection[int] = ()
    ) -> int | None:
        """Where a session stands: the highest id of its live window that is done or reserved by
        another holder (a lease not lapsed; ``exclude``: the caller's own reservations, not
        counted). None if there is none, or no live window for the session."""
        ...


class StoreSettings:
    """The read-only settings every replay store exposes (``config``, ``max_skew_us``,
    ``history_start_us``, ``reservation_lease_us``), from ``_config``, ``_history_start_us`` and
    ``_reservation_lease_us``."""

    _config: ReplayConfig
    _history_start_us: int | None
    #: None: reservations never lapse (the in-memory store).
    _reservation_lease_us: int | None = None

    @property
    def config(self) -> ReplayConfig:
        return self._config

    @property
    def max_skew_us(self) -> int:
        return self._config.max_skew_us

    @property
    def history_start_us(self) -> int | None:
        return self._history_start_us

    @property
    def reservation_lease_us(self) -> int | None:
        return self._reservation_lease_us


class ReplayGuard:
    """Freshness plus a :class:`ReplayStore`: the receive pipeline's replay step.

    Freshness is checked first (cheap, and a stale message never creates a
    window); the skew and the history start come from the store, so the two
    cannot disagree. Methods return the store's :class:`Verdict`; use
    :func:`require_new` to turn a refusal into ``replayed_message``.
    """

    def __init__(self, store: ReplayStore) -> None:
        self._store = store

    @property
    def store(self) -> ReplayStore:
        return self._store

    def check_fresh(self, timestamp_us: int, now_us: int) -> None:
        """Raise ``stale_message`` unless ``timestamp_us`` is fresh for this store."""
        check_freshness(timestamp_us, now_us, self._store.max_skew_us, self._store.history_start_us)

    def check_and_mark(
        self,
        sender: str,
        session_id: int,
        msg_id: int,
        timestamp_us: int,
        now_us: int,
        *,
        via: str | None = None,
    ) -> Verdict:
        """Freshness, then single-phase check-and-set."""
        self.check_fresh(timestamp_us, now_us)
        if via is None or via == sender:
            return self._store.check_and_mark(sender, session_id, msg_id, now_us)
        return self._store.check_and_mark(sender, session_id, msg_id, now_us, via=via)

    def reserve(
        self,
        sender: str,
        session_id: int,
        msg_id: int,
        timestamp_us: int,
        now_us: int,
        *,
        via: str | None = None,
    ) -> Verdict:
        """Freshness, then reserve (two-phase); follow a NEW with :meth:`commit` or :meth:`release`."""
        self.check_fresh(timestamp_us, now_us)
        if via is None or via == sender:
            return self._store.reserve(sender, session_id, msg_id, now_us)
        return self._store.reserve(sender, session_id, msg_id, now_us, via=via)

    def commit(self, sender: str, session_id: int, msg_id: int, now_us: int) -> None:
        self._store.commit(sender, session_id, msg_id, now_us)

    def release(self, sender: str, session_id: int, msg_id: int, now_us: int) -> None:
        self._store.release(sender, session_id, msg_id, now_us)

    def expire(self, now_us: int) -> int:
        return self._store.expire(now_us)


def require_new(verdict: Verdict, sender: str = "", session_id: int = 0, msg_id: int = 0) -> None:
    """Raise ``replayed_message`` for any verdict but NEW."""
    if verdict is Verdict.NEW:
        return
    what = {
        Verdict.DUPLICATE: "already accepted",
        Verdict.IN_PROGRESS: "already being handled",
        Verdict.TOO_OLD: "older than the replay window",
    }[verdict]
    raise MessageRejected(f"message {sender}/{session_id}/{msg_id} {what}", reason="replayed_message")
