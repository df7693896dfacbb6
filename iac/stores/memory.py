"""The in-memory replay store: the default, fastest, and without history before its start.

The window rules (serial arithmetic, expiry, the session cap, two-phase
reserve/commit/release) are described in :mod:`iac.protocol.replay`; the SQLite
and Redis stores keep the same windows where other processes can share them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from iac.errors import MessageRejected
from iac.protocol.replay import ReplayConfig, StoreSettings, Verdict, highest_of, serial_diff
from iac.stores.common import check_u64, share_refusal

_MOD = 1 << 64
_HALF = 1 << 63
_MASK64 = _MOD - 1
#: No window: nothing can expire.
_NEVER = 1 << 127


@dataclass(slots=True)
class _Window:
    highest: int
    bitmap: int  # bit i set: id (highest - i) is done
    last_seen_us: int
    via: str  # the neighbour that delivered the session's first message (its share counts it)
    pending: set[int] = field(default_factory=set)  # reserved, not yet committed


class MemoryReplayStore(StoreSettings):
    """In-memory :class:`ReplayStore`: no history before ``started_at_us``.

    Windows are kept in arrival order (an ``OrderedDict`` moved to the end on
    every touch), so expiry pops from the front and costs amortized O(1) per
    call. Expiry uses the highest ``now_us`` seen so far, so a clock stepping
    back never expires a window early (it only keeps windows longer).

    Reserved ids count only while inside the window; ids that left it are pruned
    lazily (once a session holds more than ``2 * window_size``), so a session holds
    at most that many and the common case costs nothing per message. The caller must :meth:`commit` or
    :meth:`release` every reservation (``try``/``finally``); a commit or
    release for a window that has since expired is a no-op. Reservations have no
    lease (:attr:`reservation_lease_us` is None): the store dies with the process
    that holds them.
    """

    #: Whether other processes can share this store (this process only): see
    #: :func:`iac.protocol.tickets.check_cluster_stores`.
    shared = False

    def __init__(self, started_at_us: int, config: ReplayConfig | None = None) -> None:
        self._config = config if config is not None else ReplayConfig()
        self._history_start_us = started_at_us
        self._clock_us = started_at_us
        self._windows: OrderedDict[tuple[str, int], _Window] = OrderedDict()
        #: At most the oldest window's ``last_seen_us`` (windows only get younger, and a new one
        #: lowers it): while ``now - retention`` is not past it, nothing is due to expire.
        self._floor_us = _NEVER
        self._window_size = self._config.window_size
        self._retention_us = self._config.retention_us
        self._full_mask = (1 << self._config.window_size) - 1
        self._tenant_cap = self._config.tenant_sessions
        #: Live windows per sender and per neighbour (``via``): the tenants' shares.
        self._by_sender: dict[str, int] = {}
        self._by_via: dict[str, int] = {}

    # --- ReplayStore -------------------------------------------------------------------------

    def check_and_mark(
        self, sender: str, session_id: int, msg_id: int, now_us: int, *, via: str | None = None
    ) -> Verdict:
        return self._check(sender, session_id, msg_id, now_us, via, reserve=False)

    def reserve(
        self, sender: str, session_id: int, msg_id: int, now_us: int, *, via: str | None = None
    ) -> Verdict:
        return self._check(sender, session_id, msg_id, now_us, via, reserve=True)

    def commit(self, sender: str, session_id: int, msg_id: int, now_us: int) -> None:
        if not 0 <= msg_id <= _MASK64:
            check_u64("msg_id", msg_id)
        if now_us > self._clock_us:
            self._clock_us = now_us
        if self._clock_us - self._retention_us > self._floor_us:
            self._expire_due(now_us)
        w = self._windows.get((sender, session_id))
        if w is None:
            return  # expired: any replay is now stale
        w.pending.discard(msg_id)
        # -serial_diff(msg_id, w.highest), written out: how far behind the highest (2**63: behind)
        d = (msg_id - w.highest) & _MASK64
        offset = _MOD - d if d >= _HALF else -d
        if offset < 0:  # commit without reserve, ahead of the window: advance to it
            self._advance(w, msg_id, -offset)
            offset = 0
        if offset < self._window_size:
            w.bitmap |= 1 << offset

    def release(self, sender: str, session_id: int, msg_id: int, now_us: int) -> None:
        check_u64("msg_id", msg_id)
        self._expire_due(now_us)
        w = self._windows.get((sender, session_id))
        if w is not None:
            w.pending.discard(msg_id)

    def expire(self, now_us: int) -> int:
        return self._expire_due(now_us)

    def renew(self, keys: Sequence[tuple[str, int, int]], now_us: int) -> int:
        """Nothing to extend (reservations never lapse here); return how many are still held."""
        self._expire_due(now_us)
        held = 0
        for sender, session_id, msg_id in keys:
            w = self._windows.get((sender, session_id))
            if w is not None and msg_id in w.pending:
                held += 1
        return held

    def frontier(
        self, sender: str, session_id: int, now_us: int, exclude: Collection[int] = ()
    ) -> int | None:
        """The highest id done: every reservation here is the caller's own (one process)."""
        check_u64("session_id", session_id)
        self._expire_due(now_us)
        w = self._windows.get((sender, session_id))
        return None if w is None else highest_of(w.highest, self._window_size, w.bitmap, ())

    # --- introspection -----------------------------------------------------------------------

    def __len__(self) -> int:
        """How many sessions are tracked."""
        return len(self._windows)

    @property
    def pending_count(self) -> int:
        """How many ids are reserved but neither committed nor released (all sessions)."""
        for w in self._windows.values():
            self._prune(w)
        return sum(len(w.pending) for w in self._windows.values())

    # --- internals ---------------------------------------------------------------------------

    def _expire_due(self, now_us: int) -> int:
        if now_us > self._clock_us:
            self._clock_us = now_us
        limit = self._clock_us - self._retention_us
        windows = self._windows
        dropped = 0
        self._floor_us = _NEVER
        while windows:
            key = next(iter(windows))
            w = windows[key]
            if w.last_seen_us >= limit:  # kept while now <= last_seen + 2 * max_skew
                self._floor_us = w.last_seen_us
                break
            del windows[key]
            _unshare(self._by_sender, key[0])
            _unshare(self._by_via, w.via)
            dropped += 1
        return dropped

    def _advance(self, w: _Window, msg_id: int, shift: int) -> None:
        """Move the window's highest id ``shift`` ids ahead, to ``msg_id``."""
        w.highest = msg_id
        if shift < self._window_size:
            w.bitmap = (w.bitmap << shift) & self._full_mask
            # Reservations that left the window are harmless until pruned: lookups and
            # commits only concern ids inside it, and it moves forward.
            if w.pending and len(w.pending) > 2 * self._window_size:
                self._prune(w)
        else:  # everything behind the old highest left the window
            w.bitmap = 0
            if w.pending:
                w.pending = set()

    def _prune(self, w: _Window) -> None:
        """Drop reservations that left the window."""
        if w.pending:
            n, top = self._window_size, w.highest
            w.pending = {p for p in w.pending if serial_diff(top, p) < n}

    def _check(
        self, sender: str, session_id: int, msg_id: int, now_us: int, via: str | None, *, reserve: bool
    ) -> Verdict:
        if not (0 <= msg_id <= _MASK64 and 0 <= session_id <= _MASK64):
            check_u64("msg_id", msg_id)
            check_u64("session_id", session_id)
        if now_us > self._clock_us:
            self._clock_us = now_us
        if self._clock_us - self._retention_us > self._floor_us:
            self._expire_due(now_us)
        key = (sender, session_id)
        w = self._windows.get(key)
        if w is None:
            via = sender if via is None else via
            if len(self._windows) >= self._config.max_sessions:
                raise MessageRejected(
                    f"replay store tracks {len(self._windows)} sessions (max_sessions); "
                    "new session refused until one expires",
                    reason="replay_store_full",
                )
            cap = self._tenant_cap
            held_sender, held_via = self._by_sender.get(sender, 0), self._by_via.get(via, 0)
            if held_sender >= cap or held_via >= cap:
                raise MessageRejected(
                    share_refusal(sender, via, held_sender, held_via, cap), reason="replay_store_full"
                )
            self._by_sender[sender] = held_sender + 1
            self._by_via[via] = held_via + 1
            w = _Window(highest=msg_id, bitmap=0, last_seen_us=self._clock_us, via=via)
            self._windows[key] = w
            if self._clock_us < self._floor_us:
                self._floor_us = self._clock_us
            self._mark(w, msg_id, 0, reserve)
            return Verdict.NEW
        w.last_seen_us = self._clock_us
        self._windows.move_to_end(key)
        # serial_diff(msg_id, w.highest), written out: how far ahead of the highest (2**63: behind)
        d = (msg_id - w.highest) & _MASK64
        ahead = d - _MOD if d >= _HALF else d
        if ahead > 0:
            if ahead < self._window_size and not w.pending:
                # self._advance(w, msg_id, ahead) with no reservation held, written out (the
                # next id of a session, at 1 in flight: a call per message saved)
                w.highest = msg_id
                w.bitmap = (w.bitmap << ahead) & self._full_mask
            else:
                self._advance(w, msg_id, ahead)
            if reserve:
                w.pending.add(msg_id)
            else:
                w.bitmap |= 1
            return Verdict.NEW
        offset = -ahead
        if offset >= self._window_size:
            return Verdict.TOO_OLD
        if w.bitmap >> offset & 1:
            return Verdict.DUPLICATE
        if msg_id in w.pending:
            return Verdict.IN_PROGRESS
        self._mark(w, msg_id, offset, reserve)
        return Verdict.NEW

    @staticmethod
    def _mark(w: _Window, msg_id: int, offset: int, reserve: bool) -> None:
        if reserve:
            w.pending.add(msg_id)
        else:
            w.bitmap |= 1 << offset


def _unshare(counts: dict[str, int], tenant: str) -> None:
    n = counts.get(tenant, 0) - 1
    if n > 0:
        counts[tenant] = n
    else:
        counts.pop(tenant, None)
